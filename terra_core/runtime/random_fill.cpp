#include "random_fill.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/MT19937RNGEngine.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace terra::runtime {
namespace {

std::atomic<uint64_t> fills{0};

constexpr int64_t kChunk = 2048;  // elements per batch of draws (16 KB of them, in L1)

uint32_t temper(uint32_t y) {  // at::mt19937's
  y ^= (y >> 11);
  y ^= (y << 7) & 0x9d2c5680;
  y ^= (y << 15) & 0xefc60000;
  return y ^ (y >> 18);
}

// at::mt19937's next_state, written as loops the compiler vectorizes: the second loop reads words
// the first rewrote, N - M = 227 words back, further than a vector reaches.
void next_state(at::mt19937_data_pod& d) {
  constexpr int kN = at::MERSENNE_STATE_N, kM = at::MERSENNE_STATE_M;
  uint32_t* s = d.state_.data();
  const auto twist = [](uint32_t u, uint32_t v) {
    return (((u & at::UMASK) | (v & at::LMASK)) >> 1) ^ ((0u - (v & 1u)) & at::MATRIX_A);
  };
  for (int j = 0; j < kN - kM; ++j) s[j] = s[j + kM] ^ twist(s[j], s[j + 1]);
#pragma GCC ivdep
  for (int j = kN - kM; j < kN - 1; ++j) s[j] = s[j + kM - kN] ^ twist(s[j], s[j + 1]);
  s[kN - 1] = s[kM - 1] ^ twist(s[kN - 1], s[0]);
  d.left_ = kN;
  d.next_ = 0;
}

// The next `n` outputs of an engine with state `d`, as n calls of at::mt19937's operator() would
// give them (each first counts `left_` down and makes a new state when it reaches 0), into `out`.
void draw(at::mt19937_data_pod& d, uint32_t* out, int64_t n) {
  int64_t k = 0;
  while (k < n) {
    const int64_t run = std::min<int64_t>(d.left_ - 1, n - k);  // draws before the state runs out
    if (run == 0) {
      next_state(d);
      out[k++] = temper(d.state_[d.next_++]);
      continue;
    }
    const uint32_t* state = d.state_.data() + d.next_;
    for (int64_t j = 0; j < run; ++j) out[k + j] = temper(state[j]);
    d.next_ += static_cast<uint32_t>(run);
    d.left_ -= static_cast<int>(run);
    k += run;
  }
}

// ATen's serial kernel (cpu/DistributionTemplates.h: bernoulli_kernel with a scalar p) over
// contiguous memory, which a nullary TensorIterator walks in order: element i is
// bernoulli_distribution<double>(p) of random64() = (draw 2i << 32) | draw 2i+1, that is
// uniform_real<double>: x = v * 2^-53 with v its low 53 bits (exact), then x < p. For an integer v
// that is v < ceil(p * 2^53) (p * 2^53 is exact too), compared as two 32-bit halves.
template <typename T>
void bernoulli(T* out, int64_t n, double p, at::CPUGeneratorImpl* gen) {
  std::lock_guard<std::mutex> lock(gen->mutex_);
  at::mt19937 mt = gen->engine();
  at::mt19937_data_pod d = mt.data();
  uint32_t draws[2 * kChunk];
  const auto bound = static_cast<uint64_t>(std::ceil(std::ldexp(p, 53)));  // at most 2^53
  const auto bound_high = static_cast<uint32_t>(bound >> 32), bound_low = static_cast<uint32_t>(bound);
  for (int64_t begin = 0; begin < n; begin += kChunk) {
    const int64_t m = std::min(kChunk, n - begin);
    draw(d, draws, 2 * m);
    T* o = out + begin;
    for (int64_t i = 0; i < m; ++i) {
      const uint32_t high = draws[2 * i] & 0x1fffff, low = draws[2 * i + 1];
      o[i] = (high < bound_high) | ((high == bound_high) & (low < bound_low)) ? T(1) : T(0);
    }
  }
  mt.set_data(d);
  gen->set_engine(mt);
}

void fill(const at::Tensor& self, double p, at::CPUGeneratorImpl* gen) {
  if (self.scalar_type() == at::kFloat) bernoulli(self.data_ptr<float>(), self.numel(), p, gen);
  else bernoulli(self.data_ptr<double>(), self.numel(), p, gen);
}

bool fillable(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.layout() == at::kStrided && t.numel() > 0 &&
         (t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble) && t.is_contiguous() &&
         !t.is_conj() && !t.is_neg();
}

// The same fills through ATen and through `fill`, from two clones of the default generator.
bool same_as_aten() {
  at::Generator ours = at::detail::getDefaultCPUGenerator().clone();
  at::Generator atens = ours.clone();
  auto* impl = at::check_generator<at::CPUGeneratorImpl>(ours);
  // Sizes below and above ATen's grain size and MKL's Bernoulli block of 800, an odd one, and
  // more draws than the engine's state holds (624), so that a fill twists it.
  for (const int64_t n : {int64_t{7}, int64_t{3001}, int64_t{40000}}) {
    for (const auto dtype : {at::kFloat, at::kDouble}) {
      const at::Tensor mine = at::empty({n}, dtype), theirs = at::empty({n}, dtype);
      fill(mine, 0.3, impl);
      theirs.bernoulli_(0.3, atens);
      if (std::memcmp(mine.data_ptr(), theirs.data_ptr(), mine.nbytes()) != 0) return false;
    }
  }
  return at::equal(ours.get_state(), atens.get_state());
}

}  // namespace

RandomFill::Op RandomFill::covered(const c10::OperatorHandle& op) {
  static const bool off = [] {  // TERRA_RANDOM_FILL=0: every fill through the dispatcher (A/B runs)
    const char* v = std::getenv("TERRA_RANDOM_FILL");
    return v && std::string(v) == "0";
  }();
  if (off) return Op::None;
  const auto& name = op.schema().operator_name();
  return name.name == "aten::bernoulli_" && name.overload_name == "float" ? Op::Bernoulli : Op::None;
}

bool RandomFill::matches_aten() {
  static const bool same = same_as_aten();
  return same;
}

bool RandomFill::run(Op op, torch::jit::Stack& stack) {
  // bernoulli_.float(Tensor(a!) self, float p, *, Generator? generator) -> Tensor(a!)
  if (op != Op::Bernoulli || stack.size() != 3 || !stack[0].isTensor() || !stack[1].isDouble() ||
      !stack[2].isNone())
    return false;
  const at::Tensor& self = stack[0].toTensor();
  const double p = stack[1].toDouble();
  if (!fillable(self) || !(0 <= p && p <= 1) || !matches_aten()) return false;
  fill(self, p, at::check_generator<at::CPUGeneratorImpl>(at::detail::getDefaultCPUGenerator()));
  at::Tensor result = self;
  stack.clear();
  stack.emplace_back(std::move(result));
  fills.fetch_add(1, std::memory_order_relaxed);
  return true;
}

uint64_t RandomFill::runs() { return fills.load(std::memory_order_relaxed); }

}  // namespace terra::runtime
