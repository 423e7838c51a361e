// One OpenMP team per process: the team moves to the thread that runs the kernels.
//
// libgomp gives every thread that starts a parallel region a pool of worker threads of its own,
// kept until that thread exits. Once the GraphRunner has run one op large enough for intra-op
// threads, a process on a machine with as many cores as a pool has threads holds more OpenMP
// threads than CPUs; libgomp then stops spinning, and every parallel region of *either* thread
// becomes a futex hand-off. Measured on 2 cores, torch 2.13, in the program thread while the
// GraphRunner only kept its pool: F.linear 8x16->32 4.1 -> 47 us, a 100k-element sum 6.4 -> 57
// us, a 256x256 matmul 173 -> 260 us (bench/results/openmp_team.md).
//
// So at most one thread holds a pool at a time. The program thread releases its pool when its
// ops start going to the GraphRunner (an iteration begins co-executing); the GraphRunner releases
// its pool, as a work item in issue order, before the program thread runs ops itself again
// (leaving co-execution: a divergence, an opaque region, the end of a session). Releasing costs
// 0.25 us without a pool, about 90 us with one (its workers exit; the next parallel region makes
// new ones) — measured 0.2-0.5 ms inside real programs — so within a session the team moves at
// most once per 20 ms (a program that diverges every iteration would otherwise pay it twice per
// iteration: corpus p22 4.16x eager's step time against 1.05x without moves); in between, the
// process may hold both teams for a while. Leaving a session always takes the GraphRunner's away.
//
// Keeping both teams while co-executing was measured too (bench/run.py, 5 rounds, 2 process
// rounds, ratio to fresh-process eager, two teams vs one): resnet 2.08 vs 1.30, gpt 1.82 vs
// 1.74, stochastic_downsampling 2.54 vs 1.75, rl_cartpole 1.13 vs 1.10. With two, every parallel
// region of the GraphRunner is a futex hand-off (a chain of 256x256 adds: 65 vs 23 us/op).
//
// Results do not depend on which thread owns the team: each op still runs with the program
// thread's intra-op thread count (the GraphRunner sets it per item), so parallel reductions split
// their work exactly as eager execution does.
#pragma once

namespace terra::runtime {

// Releases the calling thread's OpenMP worker pool, if it has one (OpenMP 5.0's
// omp_pause_resource_all). A no-op inside a parallel region or without an OpenMP runtime.
void release_openmp_team();

// Sets the calling thread's intra-op thread count, for that thread only: OpenMP's nthreads ICV
// (what at::get_num_threads() and at::parallel_for read) and MKL's thread-local count.
//
// Not at::set_num_threads: besides the two, that one changes process-wide state the program's own
// ops see. It turns MKL's dynamic threading off, so from then on MKL splits even a 32x64 tanh or a
// small sgemm over every thread of the program thread's team as well (a process that never called
// it runs them on one thread: eager ops were slower and started OpenMP teams eager never has,
// and MKL's sgemm gives other bits with another thread count); it clears oneDNN's primitive cache
// (every convolution of the program rebuilds its primitive); it resizes the pthreadpool.
void set_intraop_threads(int n);

}  // namespace terra::runtime
