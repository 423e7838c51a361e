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
// So whenever the program thread runs ops itself (tracing, fallen back, Terra off), its team is
// the only one: the GraphRunner releases its pool, as a work item in issue order, before the
// program thread runs ops again (leaving co-execution: a divergence, an opaque region, the end
// of a session). Releasing costs 0.25 us without a pool, about 90 us with one (its workers exit;
// the next parallel region makes new ones), and happens only at those transitions, never per op.
//
// While co-executing, both teams are kept, on purpose. With one team the process is no longer
// oversubscribed in libgomp's eyes, so its workers spin for milliseconds after every parallel
// region; with the Python thread, the GraphRunner and a spinning worker on 2 cores, the Python
// thread loses its core. Measured (rl_cartpole, MKL opens regions even for tiny linears): 15-17
// ms/step with one team during co-execution, 7.4 with both (eager 4.3). Two teams make libgomp
// hand idle workers to the kernel at once, which is what co-execution on 2 cores needs.
//
// Results do not depend on which thread owns the team: each op still runs with the program
// thread's intra-op thread count (the GraphRunner sets it per item), so parallel reductions split
// their work exactly as eager execution does.
#pragma once

namespace terra::runtime {

// Releases the calling thread's OpenMP worker pool, if it has one (OpenMP 5.0's
// omp_pause_resource_all). A no-op inside a parallel region or without an OpenMP runtime.
void release_openmp_team();

}  // namespace terra::runtime
