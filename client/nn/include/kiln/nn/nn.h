// kiln/nn/nn.h: everything of kiln::nn in one include (Module, layers, containers, attention and
// transformer layers, init, functional).
//
//   #include <kiln/nn/nn.h>
//   namespace nn = kiln::nn;
//   auto model = std::make_shared<nn::Linear>(4, 2);
//   kiln::Tensor y = nn::functional::relu(model->forward(x));
#pragma once

#include "kiln/nn/containers.h"
#include "kiln/nn/functional.h"
#include "kiln/nn/init.h"
#include "kiln/nn/layers.h"
#include "kiln/nn/loss.h"
#include "kiln/nn/module.h"
#include "kiln/nn/transformer.h"
