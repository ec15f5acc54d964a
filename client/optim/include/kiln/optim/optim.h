// kiln/optim/optim.h: the whole of kiln::optim: optimizers, LR schedulers, gradient clipping.
//
//   #include <kiln/optim/optim.h>
//   kiln::optim::AdamW opt(params, {.lr = 3e-4});
//   kiln::optim::CosineAnnealingLR sched(opt, {.T_max = steps});
//   loss.backward(); kiln::optim::clip_grad_norm_(params, 1.0);
//   opt.step(); opt.zero_grad(); sched.step();
#pragma once

#include "kiln/optim/clip_grad.h"
#include "kiln/optim/lr_scheduler.h"
#include "kiln/optim/optimizer.h"
#include "kiln/optim/optimizers.h"
