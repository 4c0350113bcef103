// AdamW's step with the gradients clipped to a total norm, for every parameter at once, on the CPU
// (sb3_amago/clipped_step.py, which decides when it runs).
//
// torch's fused AdamW runs its kernel tensor by tensor, each a parallel region of its own, after a
// Python loop over the parameters; the clip's norms are one region per tensor too. Here each phase is
// one region over all the tensors: the norms of the small gradients (the large ones keep torch's own
// parallel reduction, so every norm is the one clip_grad_norm_ computes), then the step, the elements
// of all the tensors cut into one near-equal share per thread. The step's arithmetic is torch's fused
// CPU AdamW's, operation for operation and in the same vector width, so the values are the same bit
// for bit: the grad divided by the scale (and stored back), the decoupled decay, the first moment as a
// lerp, the second as a product plus a fused multiply-add, then the update. The last few elements of
// each tensor (fewer than a vector), which torch's kernel runs through scalar code, go through torch's
// kernel itself. Floating-point contraction is off in this file: a product and a sum are fused only
// where written so, as torch's build fuses them.

#pragma GCC optimize("fp-contract=off")

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

namespace adamw {

using Vec = at::vec::Vectorized<float>;

// Cut points of the shares are multiples of this many elements (whole cache lines, whole vectors).
constexpr int64_t kAlign = 1024;

struct Span {
  int64_t tensor, begin, end;
};

// In double, as torch's kernel takes them; each vector constant is rounded to float from its double value.
struct Hyper {
  double lr, beta1, beta2, weight_decay, eps;
};

// The first `body[i]` elements of each tensor cut into `n_shares` runs of near-equal length, in order.
std::vector<std::vector<Span>> share_out(const std::vector<int64_t>& body, int64_t n_shares) {
  int64_t total = 0;
  for (auto n : body) total += n;
  const int64_t share = std::max<int64_t>(kAlign, (total + n_shares - 1) / n_shares);
  std::vector<std::vector<Span>> shares(n_shares);
  int64_t current = 0, room = share;
  for (int64_t i = 0; i < static_cast<int64_t>(body.size()); ++i) {
    for (int64_t at = 0; at < body[i];) {
      int64_t take = std::min(body[i] - at, room);
      if (at + take < body[i]) take = std::min(body[i] - at, std::max(kAlign, take / kAlign * kAlign));
      shares[std::min(current, n_shares - 1)].push_back({i, at, at + take});
      at += take;
      room -= take;
      if (room <= 0) {
        ++current;
        room = share;
      }
    }
  }
  return shares;
}

// One tensor's step: its constants, from the step count (rounded to float from their double values, as
// torch's kernel does).
struct Step {
  Vec scale, keep, beta2, weight2, bias2_sqrt, eps, neg_step_size, coefficient;
  bool decay, from_start;

  Step(float grad_scale, const Hyper& h, double step) {
    auto vec = [](double x) { return Vec(static_cast<float>(x)); };
    const double bias_correction1 = 1 - std::pow(h.beta1, step), bias_correction2 = 1 - std::pow(h.beta2, step);
    scale = Vec(grad_scale);
    keep = vec(1 - h.lr * h.weight_decay);
    beta2 = vec(h.beta2);
    weight2 = vec(1 - h.beta2);
    bias2_sqrt = vec(std::sqrt(bias_correction2));
    eps = vec(h.eps);
    neg_step_size = vec(-(h.lr / bias_correction1));
    decay = h.weight_decay != 0;
    // exp_avg.lerp_(grad, 1 - beta1): start + w * (end - start) for w < 0.5, else end - (1 - w) * (end - start)
    const float weight1 = static_cast<float>(1 - h.beta1);
    from_start = std::abs(weight1) < 0.5f;
    coefficient = Vec(from_start ? weight1 : weight1 - 1);
  }

  // Over n elements, n a multiple of the vector width.
  void run(float* param, float* grad, float* exp_avg, float* exp_avg_sq, int64_t n) const {
    for (int64_t i = 0; i < n; i += Vec::size()) {
      Vec g = Vec::loadu(grad + i) / scale;
      g.store(grad + i);
      Vec p = Vec::loadu(param + i);
      if (decay) p = p * keep;
      Vec m = Vec::loadu(exp_avg + i);
      m = at::vec::fmadd(coefficient, g - m, from_start ? m : g);
      Vec v = at::vec::fmadd(weight2 * g, g, Vec::loadu(exp_avg_sq + i) * beta2);
      m.store(exp_avg + i);
      v.store(exp_avg_sq + i);
      p = p + neg_step_size * m / (v.sqrt() / bias2_sqrt + eps);
      p.store(param + i);
    }
  }
};

}  // namespace adamw

// Whether the step can run on these tensors: each parameter, its gradient and its moments contiguous fp32
// CPU tensors of one size, its step count an fp32 CPU scalar.
bool steppable(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
               const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
               const std::vector<at::Tensor>& steps) {
  const size_t n = params.size();
  if (grads.size() != n || exp_avgs.size() != n || exp_avg_sqs.size() != n || steps.size() != n) return false;
  auto plain = [](const at::Tensor& t) {
    return t.defined() && t.layout() == at::kStrided && t.device().is_cpu() && t.scalar_type() == at::kFloat &&
           t.is_contiguous();
  };
  for (size_t i = 0; i < n; ++i) {
    const int64_t numel = params[i].numel();
    for (const auto* t : {&params[i], &grads[i], &exp_avgs[i], &exp_avg_sqs[i]})
      if (!plain(*t) || t->numel() != numel) return false;
    if (!plain(steps[i]) || steps[i].numel() != 1) return false;
  }
  return true;
}

// The clipped step, where `steppable`: the gradients' total norm before clipping (else nothing, and nothing
// changed). The i-th tensor of each list belongs to the i-th parameter; steps are its step counts. The
// gradients are divided by max(1, (norm + norm_eps) / max_norm).
std::optional<at::Tensor> clipped_adamw_step(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                                             const std::vector<at::Tensor>& exp_avgs,
                                             const std::vector<at::Tensor>& exp_avg_sqs,
                                             const std::vector<at::Tensor>& steps, double lr, double beta1, double beta2,
                                             double weight_decay, double eps, double max_norm,
                                             double norm_eps) {
  using namespace adamw;
  if (!steppable(params, grads, exp_avgs, exp_avg_sqs, steps)) return std::nullopt;
  at::NoGradGuard no_grad;
  const int64_t n = static_cast<int64_t>(params.size());
  const int64_t n_threads = at::get_num_threads();

  // The norms: a gradient torch's reduction would split over the threads (from its grain size on) keeps
  // that reduction (its sum in that order); the rest are summed one per thread in one region, as torch
  // sums them alone.
  std::vector<at::Tensor> norms(n);
  std::vector<int64_t> small;
  for (int64_t i = 0; i < n; ++i) {
    if (grads[i].numel() >= at::internal::GRAIN_SIZE)
      norms[i] = at::linalg_vector_norm(grads[i], 2);
    else
      small.push_back(i);
  }
  at::parallel_for(0, static_cast<int64_t>(small.size()), 1, [&](int64_t begin, int64_t end) {
    at::NoGradGuard no_grad_here;  // grad mode is per thread
    for (int64_t k = begin; k < end; ++k) norms[small[k]] = at::linalg_vector_norm(grads[small[k]], 2);
  });
  at::Tensor total = n ? at::linalg_vector_norm(at::stack(norms), 2) : at::zeros({});
  at::Tensor grad_scale = at::clamp_min((total + norm_eps) / max_norm, 1.0);

  for (const auto& s : steps) *s.data_ptr<float>() += 1.0f;

  const Hyper h{lr, beta1, beta2, weight_decay, eps};
  const float scale = grad_scale.item<float>();
  std::vector<int64_t> body(n);
  std::vector<at::Tensor> tail_params, tail_grads, tail_exp_avgs, tail_exp_avg_sqs, tail_steps;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t numel = params[i].numel();
    body[i] = numel / Vec::size() * Vec::size();
    if (body[i] < numel) {
      auto tail = [&](const at::Tensor& t) { return t.view({-1}).slice(0, body[i], numel); };
      tail_params.push_back(tail(params[i]));
      tail_grads.push_back(tail(grads[i]));
      tail_exp_avgs.push_back(tail(exp_avgs[i]));
      tail_exp_avg_sqs.push_back(tail(exp_avg_sqs[i]));
      tail_steps.push_back(steps[i]);
    }
  }
  const auto shares = share_out(body, n_threads);
  at::parallel_for(0, n_threads, 1, [&](int64_t begin, int64_t end) {
    at::NoGradGuard no_grad_here;
    for (int64_t t = begin; t < end; ++t)
      for (const auto& s : shares[t])
        Step(scale, h, *steps[s.tensor].data_ptr<float>())
            .run(params[s.tensor].data_ptr<float>() + s.begin, grads[s.tensor].data_ptr<float>() + s.begin,
                 exp_avgs[s.tensor].data_ptr<float>() + s.begin, exp_avg_sqs[s.tensor].data_ptr<float>() + s.begin,
                 s.end - s.begin);
  });
  if (!tail_params.empty())
    at::_fused_adamw_(tail_params, tail_grads, tail_exp_avgs, tail_exp_avg_sqs, {}, tail_steps, lr, beta1, beta2,
                      weight_decay, eps, false, false, grad_scale, std::nullopt);
  return total;
}
