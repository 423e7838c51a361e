// Random fills replayed without a call per random number: dropout's Bernoulli masks and
// `torch.rand`.
//
// ATen's CPU `bernoulli_(p)` (dropout's mask: `empty_like(x).bernoulli_(1 - p)`) and `uniform_`
// (`torch.rand`: `empty(size).uniform_(0, 1)`) draw element by element: a serial TensorIterator
// loop whose every element calls CPUGeneratorImpl::random64 (or random) through the PLT, at::mt19937
// draws whose state is remade every 624 draws. On hf_bert, whose dropout masks every attention
// probability and hidden state, that loop took 16% of the GraphRunner's time (perf, forced
// co-execution): about 5 ns per element; `torch.rand` masks took 8% of dropblock's. `RandomFill`
// makes the same numbers in batches, over a copy of the default generator's engine: the state
// remade and tempered in loops the compiler vectorizes, the draws turned into values by integer
// arithmetic that gives exactly ATen's distributions (random_fill.cpp), and the engine put back
// as ATen's kernel leaves it. About 1.1 ns per mask element; the GraphRunner's CPU time per step
// of hf_bert 5.0-5.3 -> 4.3-4.6 ms, of dropblock 8.4 -> 7.8-7.9.
//
// Which kernel ATen runs is not visible from its headers (a build with MKL may draw the mask from
// an MKL stream seeded by one draw of the generator), so the first use in a process checks it: the
// same fills on two clones of the default generator, ATen's and this one's, must give the same
// bits and leave the same generator state; if not, every fill takes the dispatcher.
//
// Covered, on a contiguous float or double CPU tensor with the default generator: `bernoulli_.float`
// with a p in [0, 1], `uniform_` from 0 to 1 and `rand` (the default overload). `uniform_` over
// another range is not: ATen's vectorized builds compute `x * (to - from) + from` as one fused
// multiply-add, which another build may not; from 0 to 1 both give x. Any other call takes the
// dispatcher as before (which raises where ATen raises). `TERRA_RANDOM_FILL=0` turns it off
// (every fill through the dispatcher).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstdint>

namespace terra::runtime {

class RandomFill {
 public:
  enum class Op : uint8_t { None, Bernoulli, Uniform, Rand };
  // The covered operator `op` is (None: not covered).
  static Op covered(const c10::OperatorHandle& op);
  // Runs the fill on `stack` (its arguments in, its result out, as a boxed call leaves it).
  // False, with `stack` untouched: these arguments are not covered, or this process's ATen draws
  // otherwise (run the kernel as usual).
  static bool run(Op op, torch::jit::Stack& stack);
  // Whether the fills give ATen's bits and generator states in this process (checked once).
  static bool matches_aten();
};

}  // namespace terra::runtime
