// kiln/kiln.h: everything a C++ user of the eager runtime needs.
//
//   #include <kiln/kiln.h>
//   kiln::Tensor x = kiln::randn({4, 3});
//   kiln::Tensor y = (x * 2 + 1).relu().sum(std::vector<int64_t>{1});
//   std::cout << y << "\n";
//   kiln::manual_seed(0);
#pragma once

#include "kiln/autocast.h"
#include "kiln/dispatcher.h"
#include "kiln/generated/ops.h"
#include "kiln/generator.h"
#include "kiln/ivalue.h"
#include "kiln/operators.h"
#include "kiln/parallel.h"
#include "kiln/tensor.h"
