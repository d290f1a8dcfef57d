// GPT model.
#include "trainer/gpt.h"

#include <cmath>

namespace endure::trainer {

namespace F = torch::nn::functional;

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const ModelConfig& config) : heads_(config.heads) {
  qkv_ = register_module("qkv", torch::nn::Linear(config.d_model, 3 * config.d_model));
  proj_ = register_module("proj", torch::nn::Linear(config.d_model, config.d_model));
  // A buffer, so it follows the module, but not a parameter: it is not saved.
  mask_ = torch::ones({config.context, config.context}, torch::kBool).triu(1);
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), H = heads_, D = C / H;
  std::vector<torch::Tensor> qkv = qkv_->forward(x).split(C, /*dim=*/2);
  auto heads = [&](const torch::Tensor& t) { return t.view({B, T, H, D}).transpose(1, 2); };
  torch::Tensor q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
  torch::Tensor att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(D)));
  att = att.masked_fill(mask_.index({torch::indexing::Slice(0, T), torch::indexing::Slice(0, T)}),
                        -std::numeric_limits<float>::infinity());
  att = torch::softmax(att, -1);
  torch::Tensor y = torch::matmul(att, v).transpose(1, 2).contiguous().view({B, T, C});
  return proj_->forward(y);
}

BlockImpl::BlockImpl(const ModelConfig& config) {
  const int64_t C = config.d_model;
  ln1_ = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({C})));
  attn_ = register_module("attn", CausalSelfAttention(config));
  ln2_ = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({C})));
  fc_ = register_module("fc", torch::nn::Linear(C, 4 * C));
  fc_proj_ = register_module("fc_proj", torch::nn::Linear(4 * C, C));
}

torch::Tensor BlockImpl::forward(torch::Tensor x) {
  x = x + attn_->forward(ln1_->forward(x));
  return x + fc_proj_->forward(F::gelu(fc_->forward(ln2_->forward(x))));
}

GPTImpl::GPTImpl(const ModelConfig& config) : config_(config) {
  token_emb_ = register_module("token_emb", torch::nn::Embedding(config.vocab, config.d_model));
  pos_emb_ = register_module("pos_emb", torch::nn::Embedding(config.context, config.d_model));
  blocks_ = register_module("blocks", torch::nn::ModuleList());
  for (int i = 0; i < config.layers; ++i) blocks_->push_back(Block(config));
  ln_f_ =
      register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.d_model})));
  head_ = register_module(
      "head",
      torch::nn::Linear(torch::nn::LinearOptions(config.d_model, config.vocab).bias(false)));
  // GPT-2 initialisation: N(0, 0.02) for weights and embeddings, zero biases.
  torch::NoGradGuard no_grad;
  for (auto& p : named_parameters()) {
    if (p.key().find("bias") != std::string::npos) {
      p.value().zero_();
    } else if (p.key().find("ln") == std::string::npos) {
      p.value().normal_(0.0, 0.02);
    }
  }
}

torch::Tensor GPTImpl::forward(const torch::Tensor& tokens) {
  const int64_t T = tokens.size(1);
  torch::Tensor pos = torch::arange(T, torch::kLong);
  torch::Tensor x = token_emb_->forward(tokens) + pos_emb_->forward(pos);
  for (auto& block : *blocks_) {
    if (ShouldStop()) throw StepStopped();
    x = block->as<Block>()->forward(x);
  }
  return head_->forward(ln_f_->forward(x));
}

torch::Tensor GPTImpl::Loss(const torch::Tensor& tokens, const torch::Tensor& targets) {
  torch::Tensor logits = forward(tokens);
  return F::cross_entropy(logits.view({-1, config_.vocab}), targets.reshape({-1}));
}

torch::Tensor GPTImpl::Generate(torch::Tensor prompt, int count, double temperature,
                                torch::Generator& generator) {
  torch::NoGradGuard no_grad;
  torch::Tensor seq = prompt.to(torch::kLong);
  for (int i = 0; i < count; ++i) {
    const int64_t start = std::max<int64_t>(0, seq.size(0) - config_.context);
    torch::Tensor window = seq.slice(0, start).unsqueeze(0);
    torch::Tensor logits = forward(window).select(1, window.size(1) - 1).squeeze(0);
    torch::Tensor probs = torch::softmax(logits / temperature, -1);
    torch::Tensor next = torch::multinomial(probs, 1, /*replacement=*/false, generator);
    seq = torch::cat({seq, next});
  }
  return seq;
}

void GPTImpl::StopStepsWhen(std::function<bool()> stop) {
  stop_ = std::make_shared<std::function<bool()>>(std::move(stop));
  for (const torch::Tensor& p : parameters()) {
    p.register_hook([stop = stop_](const torch::Tensor&) {
      if ((*stop)()) throw StepStopped();
    });
  }
}

}  // namespace endure::trainer
