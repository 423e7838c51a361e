#include "random_fill.h"


#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/MT19937RNGEngine.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>

namespace terra::runtime {
namespace {

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

// The draws of `n` elements, `per` each, chunk by chunk, from the default generator's engine (a
// copy, put back after): `use(out, m, draws)` turns m elements' draws into values.
template <typename T, typename Use>
void with_draws(T* out, int64_t n, int per, at::CPUGeneratorImpl* gen, Use use) {
  std::lock_guard<std::mutex> lock(gen->mutex_);
  at::mt19937 mt = gen->engine();
  at::mt19937_data_pod d = mt.data();
  uint32_t draws[2 * kChunk];
  for (int64_t begin = 0; begin < n; begin += kChunk) {
    const int64_t m = std::min(kChunk, n - begin);
    draw(d, draws, per * m);
    use(out + begin, m, draws);
  }
  mt.set_data(d);
  gen->set_engine(mt);
}

// ATen's serial kernels (cpu/DistributionTemplates.h) over contiguous memory, which a nullary
// TensorIterator walks in order.
//
// bernoulli_kernel with a scalar p: element i is bernoulli_distribution<double>(p) of random64() =
// (draw 2i << 32) | draw 2i+1, that is uniform_real<double>: x = v * 2^-53 with v its low 53 bits
// (exact), then x < p. For an integer v that is v < ceil(p * 2^53) (p * 2^53 is exact too),
// compared as two 32-bit halves.
template <typename T>
void bernoulli(T* out, int64_t n, double p, at::CPUGeneratorImpl* gen) {
  const auto bound = static_cast<uint64_t>(std::ceil(std::ldexp(p, 53)));  // at most 2^53
  const auto bound_high = static_cast<uint32_t>(bound >> 32), bound_low = static_cast<uint32_t>(bound);
  with_draws(out, n, 2, gen, [&](T* o, int64_t m, const uint32_t* draws) {
    for (int64_t i = 0; i < m; ++i) {
      const uint32_t high = draws[2 * i] & 0x1fffff, low = draws[2 * i + 1];
      o[i] = (high < bound_high) | ((high == bound_high) & (low < bound_low)) ? T(1) : T(0);
    }
  });
}

// uniform_kernel from 0 to 1: uniform_real_distribution<T>, of random() for float (its low 24
// bits times 2^-24) and of random64() for double (its low 53 bits times 2^-53), then
// `x * (to - from) + from`, which is x itself whether or not a build fuses it (x * 1 + 0), and
// never `to` (x < 1), so ATen's clamp changes nothing.
void uniform(float* out, int64_t n, at::CPUGeneratorImpl* gen) {
  with_draws(out, n, 1, gen, [](float* o, int64_t m, const uint32_t* draws) {
    for (int64_t i = 0; i < m; ++i) o[i] = static_cast<float>(static_cast<int32_t>(draws[i] & 0xffffff)) * 0x1p-24f;
  });
}

void uniform(double* out, int64_t n, at::CPUGeneratorImpl* gen) {
  with_draws(out, n, 2, gen, [](double* o, int64_t m, const uint32_t* draws) {
    for (int64_t i = 0; i < m; ++i) {
      const double high = static_cast<double>(static_cast<int32_t>(draws[2 * i] & 0x1fffff));
      const double low = static_cast<double>(draws[2 * i + 1]);
      o[i] = (high * 0x1p32 + low) * 0x1p-53;  // v * 2^-53, every step exact (v < 2^53)
    }
  });
}

// A Bernoulli mask of `p` (`mask`), else uniform from 0 to 1.
void fill(bool mask, const at::Tensor& self, double p, at::CPUGeneratorImpl* gen) {
  const bool single = self.scalar_type() == at::kFloat;
  if (mask) {
    if (single) bernoulli(self.data_ptr<float>(), self.numel(), p, gen);
    else bernoulli(self.data_ptr<double>(), self.numel(), p, gen);
  } else {
    if (single) uniform(self.data_ptr<float>(), self.numel(), gen);
    else uniform(self.data_ptr<double>(), self.numel(), gen);
  }
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
      fill(true, mine, 0.3, impl);
      theirs.bernoulli_(0.3, atens);
      if (std::memcmp(mine.data_ptr(), theirs.data_ptr(), mine.nbytes()) != 0) return false;
      fill(false, mine, 0, impl);
      theirs.uniform_(0, 1, atens);
      if (std::memcmp(mine.data_ptr(), theirs.data_ptr(), mine.nbytes()) != 0) return false;
    }
  }
  return at::equal(ours.get_state(), atens.get_state());
}

// rand.default(SymInt[] size, *, ScalarType? dtype, Layout? layout, Device? device, bool? pin_memory):
// what ATen allocates (`at::empty(size, options)`) where that is a non-empty CPU tensor of a
// covered dtype.
std::optional<at::Tensor> rand_output(const torch::jit::Stack& stack) {
  if (stack.size() != 5 || !stack[0].isIntList()) return std::nullopt;
  const std::vector<int64_t> size = stack[0].toIntVector();
  if (c10::multiply_integers(size) <= 0) return std::nullopt;
  const at::ScalarType dtype = stack[1].isNone() ? c10::typeMetaToScalarType(c10::get_default_dtype())
                                                 : stack[1].toScalarType();
  const bool strided = stack[2].isNone() || stack[2].toLayout() == at::kStrided;
  const bool cpu = stack[3].isNone() || stack[3].toDevice().is_cpu();
  const bool pinned = !stack[4].isNone() && stack[4].toBool();
  if (!strided || !cpu || pinned || (dtype != at::kFloat && dtype != at::kDouble)) return std::nullopt;
  return at::empty(size, at::TensorOptions().dtype(dtype));
}

}  // namespace

RandomFill::Op RandomFill::covered(const c10::OperatorHandle& op) {
  static const bool on = [] {  // TERRA_RANDOM_FILL=0: through the dispatcher (A/B runs)
    const char* v = std::getenv("TERRA_RANDOM_FILL");
    return !(v && std::string(v) == "0");
  }();
  if (!on) return Op::None;
  const auto& name = op.schema().operator_name();
  if (name.name == "aten::bernoulli_" && name.overload_name == "float") return Op::Bernoulli;
  if (name.name == "aten::uniform_" && name.overload_name.empty()) return Op::Uniform;
  if (name.name == "aten::rand" && name.overload_name.empty()) return Op::Rand;
  return Op::None;
}

bool RandomFill::matches_aten() {
  static const bool same = same_as_aten();
  return same;
}

bool RandomFill::run(Op op, torch::jit::Stack& stack) {
  if (op == Op::None || !matches_aten()) return false;
  at::Tensor self;
  double p = 0;
  if (op == Op::Bernoulli) {
    // bernoulli_.float(Tensor(a!) self, float p, *, Generator? generator) -> Tensor(a!)
    if (stack.size() != 3 || !stack[0].isTensor() || !stack[1].isDouble() || !stack[2].isNone()) return false;
    self = stack[0].toTensor();
    p = stack[1].toDouble();
    if (!(0 <= p && p <= 1)) return false;
  } else if (op == Op::Uniform) {
    // uniform_(Tensor(a!) self, float from, float to, *, Generator? generator) -> Tensor(a!)
    if (stack.size() != 4 || !stack[0].isTensor() || !stack[1].isDouble() || !stack[2].isDouble() ||
        stack[1].toDouble() != 0 || stack[2].toDouble() != 1 || !stack[3].isNone())
      return false;
    self = stack[0].toTensor();
  } else {
    std::optional<at::Tensor> out = rand_output(stack);
    if (!out) return false;
    self = std::move(*out);  // a fresh tensor, as ATen's rand makes it, filled as its uniform_(0, 1)
  }
  if (!fillable(self)) return false;
  fill(op == Op::Bernoulli, self, p, at::check_generator<at::CPUGeneratorImpl>(at::detail::getDefaultCPUGenerator()));
  stack.clear();
  stack.emplace_back(std::move(self));
  return true;
}

}  // namespace terra::runtime
