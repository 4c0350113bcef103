// The Python module of the package's CPU kernels (sb3_amago/nets/cpu_kernels.py): one build of
// cpu_attention.cpp and cpu_dropout.cpp.

#include <torch/extension.h>

#include <vector>

std::vector<at::Tensor> causal_attention_forward(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin);
at::Tensor causal_attention_backward(const at::Tensor& grad, const at::Tensor& qkv, const at::Tensor& cos,
                                     const at::Tensor& sin, const at::Tensor& out, const at::Tensor& lse);
at::Tensor dropout_keep_mask(const at::Tensor& like, const at::Tensor& key, int64_t steps, double scale);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("attention_forward", &causal_attention_forward, "causal attention of a projection, rotary tables unless empty: (out, logsumexp)");
  m.def("attention_backward", &causal_attention_backward, "causal attention's gradient of the projection");
  m.def("dropout_keep_mask", &dropout_keep_mask, "dropout's keep mask of a key (see dropout.py's keep_mask)");
}
