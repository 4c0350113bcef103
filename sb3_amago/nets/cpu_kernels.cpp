// The Python module of the package's CPU kernels (sb3_amago/nets/cpu_kernels.py): one build of
// cpu_attention.cpp and cpu_dropout.cpp.

#include <torch/extension.h>

#include <vector>

std::vector<at::Tensor> causal_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                 const at::Tensor& cos, const at::Tensor& sin);
std::vector<at::Tensor> causal_attention_backward(const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k,
                                                  const at::Tensor& v, const at::Tensor& cos, const at::Tensor& sin,
                                                  const at::Tensor& out, const at::Tensor& lse);
at::Tensor dropout_keep_mask(const at::Tensor& like, const at::Tensor& key, int64_t steps, double scale);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("attention_forward", &causal_attention_forward, "causal attention, rotary tables unless empty: (out, logsumexp)");
  m.def("attention_backward", &causal_attention_backward, "causal attention's gradients: (dq, dk, dv)");
  m.def("dropout_keep_mask", &dropout_keep_mask, "dropout's keep mask of a key (see dropout.py's keep_mask)");
}
