// The Python module of the package's CPU kernels (sb3_amago/nets/cpu_kernels.py): one build of
// cpu_attention.cpp, cpu_dropout.cpp, cpu_block_cache.cpp and cpu_adamw.cpp, and the CPU kernels of the package's
// operators in C++.

#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/extension.h>
#include <torch/library.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <optional>

#include <tuple>
#include <vector>

std::vector<at::Tensor> causal_attention_forward(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin);
at::Tensor causal_attention_backward(const at::Tensor& grad, const at::Tensor& qkv, const at::Tensor& cos,
                                     const at::Tensor& sin, const at::Tensor& out, const at::Tensor& lse);
at::Tensor dropout_keep_mask(const at::Tensor& like, const at::Tensor& key, int64_t steps, double scale);
bool cache_freed_blocks(int64_t cap_bytes);
void release_freed_blocks();
std::vector<int64_t> freed_block_stats();
std::optional<at::Tensor> clipped_adamw_step(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                                             const std::vector<at::Tensor>& exp_avgs,
                                             const std::vector<at::Tensor>& exp_avg_sqs,
                                             const std::vector<at::Tensor>& steps, double lr, double beta1, double beta2,
                                             double weight_decay, double eps, double max_norm,
                                             double norm_eps);

namespace {

// Each operator's CPU kernel computes what its Python kernel does (the module named beside it), with the
// same torch operators (linear_leaky_relu: the same arithmetic, its bias and rectifier in one pass): the
// same values, and the same draws from torch's generator.

// sb3_amago::causal_attention (cpu_attention.py)
std::tuple<at::Tensor, at::Tensor> causal_attention(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin) {
  auto result = causal_attention_forward(qkv, cos, sin);
  return {result[0], result[1]};
}

// sb3_amago::causal_attention's autograd on the CPU (its only one: the operator has no Python formula),
// in C++ so that an eager update's attention gradients run without Python. It saves the inputs and both
// outputs and calls sb3_amago::causal_attention_backward; both operators are called through the
// dispatcher, below autograd, so tracing (torch.compile's fake tensors) records them.
class CausalAttentionFunction : public torch::autograd::Function<CausalAttentionFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& qkv,
                                                const at::Tensor& cos, const at::Tensor& sin) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("sb3_amago::causal_attention", "")
                               .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&)>();
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [out, lse] = op.call(qkv, cos, sin);
    ctx->save_for_backward({qkv, cos, sin, out, lse});
    return {out, lse};
  }

  // The log-sum-exp's gradient is never used (it is saved for the backward, not trained through); the
  // rotary tables have none.
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("sb3_amago::causal_attention_backward", "")
                               .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                 const at::Tensor&, const at::Tensor&)>();
    const auto saved = ctx->get_saved_variables();
    return {op.call(grads[0], saved[0], saved[1], saved[2], saved[3], saved[4]), at::Tensor(), at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor> causal_attention_autograd(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin) {
  auto result = CausalAttentionFunction::apply(qkv, cos, sin);
  return {result[0], result[1]};
}

// sb3_amago::stack_projection (cpu_attention.py)
at::Tensor stack_projection(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return at::stack({q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)}, 2);
}

// sb3_amago::stack_projection's autograd on the CPU, its only one (the operator runs only with this build,
// under causal_attention): the projection's gradient split into views of its queries', keys' and values'.
class StackProjectionFunction : public torch::autograd::Function<StackProjectionFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("sb3_amago::stack_projection", "")
                               .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>();
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return op.call(q, k, v);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    auto parts = grads[0].unbind(2);
    return {parts[0].transpose(1, 2), parts[1].transpose(1, 2), parts[2].transpose(1, 2)};
  }
};

at::Tensor stack_projection_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return StackProjectionFunction::apply(q, k, v);
}

// sb3_amago::leaky_relu and its twin without autograd, leaky_relu_kernel (activations.py)
at::Tensor leaky_relu(const at::Tensor& x, double negative_slope) { return at::leaky_relu(x, negative_slope); }

// The rows of y, a product's output of `groups` equal blocks of rows (the ensemble members), each
// plus its block's row of `bias` (groups, width), then the rectifier: one pass, in place. addmm and
// baddbmm would first copy the bias into the whole output (to memory the caches no longer hold), and
// the rectifier would pass over it again. fp32, both contiguous, y not empty.
void add_bias_leaky_relu_(at::Tensor& y, const at::Tensor& bias, int64_t groups, double negative_slope) {
  using Vec = at::vec::Vectorized<float>;
  const int64_t width = y.size(-1), rows = y.numel() / width, rows_per_group = rows / groups;
  float* out = y.data_ptr<float>();
  const float* biases = bias.data_ptr<float>();
  const float slope = static_cast<float>(negative_slope);
  at::parallel_for(0, rows, std::max<int64_t>(1, at::internal::GRAIN_SIZE / width), [&](int64_t begin, int64_t end) {
    const Vec zero(0.0f), slopes(slope);
    for (int64_t r = begin; r < end; ++r) {
      float* row = out + r * width;
      const float* b = biases + (r / rows_per_group) * width;
      int64_t j = 0;
      for (; j + Vec::size() <= width; j += Vec::size()) {
        const Vec v = Vec::loadu(row + j) + Vec::loadu(b + j);
        Vec::blendv(v * slopes, v, v > zero).store(row + j);
      }
      for (; j < width; ++j) {
        const float v = row[j] + b[j];
        row[j] = v > 0.0f ? v : v * slope;
      }
    }
  });
}

// sb3_amago::linear_leaky_relu and its twin linear_leaky_relu_kernel (activations.py): the product without
// its bias, then the bias and the rectifier in place on its output, in one pass where that is fp32 and
// contiguous.
at::Tensor linear_leaky_relu(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                             double negative_slope, bool ensemble) {
  at::Tensor product = ensemble ? at::bmm(x, weight) : at::linear(x, weight);
  if (!bias.has_value()) return at::leaky_relu_(product, negative_slope);
  const int64_t groups = ensemble ? x.size(0) : 1;
  if (product.scalar_type() != at::kFloat || bias->scalar_type() != at::kFloat || !product.is_contiguous() ||
      !bias->is_contiguous() || product.numel() == 0 || bias->numel() != groups * product.size(-1))
    return at::leaky_relu_(product.add_(*bias), negative_slope);  // a bias broadcast over the members, too
  add_bias_leaky_relu_(product, *bias, groups, negative_slope);
  return product;
}

// sb3_amago::rotary_tables (rotary.py): the cosines and signed sines per feature, (B, 1, L, d_head).
std::tuple<at::Tensor, at::Tensor> rotary_tables(const at::Tensor& time_idx, int64_t d_head, double base) {
  const int64_t half = d_head / 2;
  const at::Tensor freqs = at::pow(base, -at::arange(half, time_idx.options().dtype(at::kFloat)) / half);
  const at::Tensor angles = time_idx.to(at::kFloat).unsqueeze(-1) * freqs;  // (B, L, half)
  const at::Tensor cos = angles.cos(), sin = angles.sin();
  return {at::cat({cos, cos}, -1).unsqueeze(1), at::cat({-sin, sin}, -1).unsqueeze(1)};
}

// sb3_amago::layer_norm_backward (layer_norm.py): torch's kernel, all three gradients.
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward(const at::Tensor& grad_out, const at::Tensor& input,
                                                                   c10::SymIntArrayRef normalized_shape, const at::Tensor& mean,
                                                                   const at::Tensor& rstd, const at::Tensor& weight,
                                                                   const at::Tensor& bias) {
  return at::native_layer_norm_backward_symint(grad_out, input, normalized_shape, mean, rstd, weight, bias, {true, true, true});
}

// sb3_amago::dropout_key (dropout.py's draw_key)
at::Tensor dropout_key(const at::Tensor& like) { return at::empty({}, like.options().dtype(at::kLong)).random_(); }

// Registers the kernels above on the CPU dispatch key, where they take precedence over the operators'
// Python kernels (registered for every device, CompositeExplicitAutograd), and on the AutogradCPU key the
// autograd of the operators that run only with this build (causal_attention, stack_projection) and, for
// those without a gradient, torch's C++ fallback, which like what torch.library registers for the
// Autograd alias makes a backward through them an error. There they take precedence over torch.library's
// Python, so compiled code calls these operators without entering it. (leaky_relu and linear_leaky_relu keep
// their Python formulas, which also serve compiled code without this build: docs/design.md; the package's
// compiled update calls their twins without autograd once traced.) Once per process; the registrations
// are kept until the process ends (never destroyed, so no static destructor runs them off after the
// dispatcher is gone).
void register_operators() {
  static torch::Library* autograd = [] {
    auto* library = new torch::Library(torch::Library::IMPL, "sb3_amago", c10::DispatchKey::AutogradCPU, __FILE__, __LINE__);
    library->impl("causal_attention", &causal_attention_autograd);
    library->impl("causal_attention_backward", torch::autograd::autogradNotImplementedFallback());
    library->impl("stack_projection", &stack_projection_autograd);
    library->impl("rotary_tables", torch::autograd::autogradNotImplementedFallback());
    library->impl("leaky_relu_kernel", torch::autograd::autogradNotImplementedFallback());
    library->impl("linear_leaky_relu_kernel", torch::autograd::autogradNotImplementedFallback());
    return library;
  }();
  (void)autograd;
  static torch::Library* operators = [] {
    auto* library = new torch::Library(torch::Library::IMPL, "sb3_amago", c10::DispatchKey::CPU, __FILE__, __LINE__);
    library->impl("causal_attention", &causal_attention);
    library->impl("causal_attention_backward", &causal_attention_backward);
    library->impl("stack_projection", &stack_projection);
    library->impl("leaky_relu", &leaky_relu);
    library->impl("linear_leaky_relu", &linear_leaky_relu);
    library->impl("leaky_relu_kernel", &leaky_relu);
    library->impl("linear_leaky_relu_kernel", &linear_leaky_relu);
    library->impl("dropout_key", &dropout_key);
    library->impl("rotary_tables", &rotary_tables);
    library->impl("layer_norm_backward", &layer_norm_backward);
    library->impl("dropout_keep_mask", &dropout_keep_mask);
    return library;
  }();
  (void)operators;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("attention_forward", &causal_attention_forward, "causal attention of a projection, rotary tables unless empty: (out, logsumexp)");
  m.def("attention_backward", &causal_attention_backward, "causal attention's gradient of the projection");
  m.def("dropout_keep_mask", &dropout_keep_mask, "dropout's keep mask of a key (see dropout.py's keep_mask)");
  m.def("register_operators", &register_operators, "the package's operators' CPU kernels in C++, registered once");
  m.def("cache_freed_blocks", &cache_freed_blocks, "the freed-block cache in front of torch's CPU allocator, with a cap in bytes: whether in use");
  m.def("release_freed_blocks", &release_freed_blocks, "the freed-block cache's blocks back to the C library");
  m.def("freed_block_stats", &freed_block_stats, "the freed-block cache's (bytes held, hits, misses)");
  m.def("clipped_adamw_step", &clipped_adamw_step, "AdamW's step on gradients clipped to a total norm (see cpu_adamw.cpp): the norm, or None where it cannot run",
        py::call_guard<py::gil_scoped_release>());
}
