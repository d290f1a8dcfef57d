// GPT: a GPT-2-style decoder-only transformer in libtorch's C++ API. Token
// and learned position embeddings, pre-LayerNorm blocks of causal multi-head
// self-attention and a GELU MLP, a final LayerNorm and a linear head (not
// tied to the embedding). No dropout: training is deterministic on the CPU.
// Includes libtorch: only trainer code includes this header.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <stdexcept>

#include "trainer/options.h"

namespace endure::trainer {

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  int heads_;
  torch::nn::Linear qkv_{nullptr}, proj_{nullptr};
  torch::Tensor mask_;  // [context, context], true above the diagonal
};
TORCH_MODULE(CausalSelfAttention);

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const ModelConfig& config);
  torch::Tensor forward(torch::Tensor x);

 private:
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  CausalSelfAttention attn_{nullptr};
  torch::nn::Linear fc_{nullptr}, fc_proj_{nullptr};
};
TORCH_MODULE(Block);

// Thrown inside a training step stopped part way (GPTImpl::StopStepsWhen).
struct StepStopped : std::runtime_error {
  StepStopped() : std::runtime_error("the step was stopped part way") {}
};

class GPTImpl : public torch::nn::Module {
 public:
  explicit GPTImpl(const ModelConfig& config);

  // tokens: int64 [batch, time] with time <= context. Returns logits
  // [batch, time, vocab].
  torch::Tensor forward(const torch::Tensor& tokens);

  // Mean cross-entropy of next-token prediction; `targets` like `tokens`.
  torch::Tensor Loss(const torch::Tensor& tokens, const torch::Tensor& targets);

  // Extends `prompt` (int64 [time]) by `count` tokens sampled at
  // `temperature` with `generator`; the context window slides.
  torch::Tensor Generate(torch::Tensor prompt, int count, double temperature,
                         torch::Generator& generator);

  const ModelConfig& config() const { return config_; }

  // Makes a training step throw StepStopped at its next block (forward, with
  // gradients enabled: not in evaluation) or its next parameter's gradient
  // (backward; libtorch's autograd engine rethrows a hook's exception) once
  // `stop` says so: a step that cannot complete (a peer died) ends there
  // instead of at its end. `stop` is asked once per block and per parameter
  // of every step; it must be cheap.
  void StopStepsWhen(std::function<bool()> stop);

 private:
  bool ShouldStop() const { return stop_ && torch::GradMode::is_enabled() && (*stop_)(); }

  ModelConfig config_;
  std::shared_ptr<std::function<bool()>> stop_;
  torch::nn::Embedding token_emb_{nullptr}, pos_emb_{nullptr};
  torch::nn::ModuleList blocks_;
  torch::nn::LayerNorm ln_f_{nullptr};
  torch::nn::Linear head_{nullptr};
};
TORCH_MODULE(GPT);

}  // namespace endure::trainer
