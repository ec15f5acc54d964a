// kiln/parallel.h: the number of threads CPU kernels may use (torch.set_num_threads).
//
//   kiln::set_num_threads(1);     // kernels then run single-threaded
//   int n = kiln::get_num_threads();
//
// tensor/ only stores the setting; kernels/cpu reads it for every parallel region, so oneDNN
// and Kiln's own loops share one OpenMP pool of this size. Results never depend on it
// (Note [Counter-based RNG], Note [CPU loops]).
#pragma once

namespace kiln {

void set_num_threads(int n);  // ValueError for n < 1
int get_num_threads();        // default: OMP_NUM_THREADS, else the number of cores

// For kernels/cpu: called with the new count on every set_num_threads (and once at
// registration), so the OpenMP runtime that oneDNN uses follows the setting too.
void set_num_threads_hook(void (*hook)(int));

}  // namespace kiln
