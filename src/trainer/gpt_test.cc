#include "trainer/gpt.h"

#include <gtest/gtest.h>

#include <map>

#include "endure/client.h"
#include "trainer/trainer.h"

namespace endure::trainer {
namespace {

ModelConfig Tiny() {
  ModelConfig c;
  c.layers = 2;
  c.d_model = 32;
  c.heads = 4;
  c.context = 16;
  return c;
}

TEST(GPT, OutputShapeAndParameterCount) {
  torch::manual_seed(0);
  GPT model(Tiny());
  torch::Tensor tokens = torch::randint(0, 256, {3, 10}, torch::kLong);
  EXPECT_EQ(model->forward(tokens).sizes(), (std::vector<int64_t>{3, 10, 256}));

  GPT standard(ModelConfig{});
  int64_t n = 0;
  for (const auto& p : standard->parameters()) n += p.numel();
  EXPECT_GT(n, 850'000);  // "about 0.9 M parameters"
  EXPECT_LT(n, 950'000);
}

TEST(GPT, IsCausal) {
  torch::manual_seed(0);
  GPT model(Tiny());
  torch::Tensor a = torch::randint(0, 256, {1, 16}, torch::kLong);
  torch::Tensor b = a.clone();
  b[0][12] = (a[0][12].item<int64_t>() + 1) % 256;
  torch::NoGradGuard no_grad;
  torch::Tensor la = model->forward(a), lb = model->forward(b);
  EXPECT_TRUE(torch::equal(la.slice(1, 0, 12), lb.slice(1, 0, 12)));
  EXPECT_FALSE(torch::allclose(la.slice(1, 12), lb.slice(1, 12)));
}

TEST(GPT, LossFallsOnATinyCorpus) {
  torch::manual_seed(0);
  GPT model(Tiny());
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-3));
  const std::string text = "the quick brown fox jumps over the lazy dog. ";
  std::vector<int64_t> ids;
  for (int r = 0; r < 4; ++r)
    for (char c : text) ids.push_back(static_cast<uint8_t>(c));
  torch::Tensor all = torch::tensor(ids, torch::kLong);
  std::vector<torch::Tensor> xs, ys;
  for (int i = 0; i < 8; ++i) {
    xs.push_back(all.slice(0, i * 5, i * 5 + 16));
    ys.push_back(all.slice(0, i * 5 + 1, i * 5 + 17));
  }
  torch::Tensor x = torch::stack(xs), y = torch::stack(ys);
  const double first = model->Loss(x, y).item<double>();
  EXPECT_NEAR(first, std::log(256.0), 0.3);  // untrained: about uniform
  double last = first;
  for (int i = 0; i < 60; ++i) {
    opt.zero_grad();
    torch::Tensor loss = model->Loss(x, y);
    loss.backward();
    opt.step();
    last = loss.item<double>();
  }
  EXPECT_LT(last, 0.3 * first);
}

// A run of a few steps of the tiny model on the default corpus.
TrainerOptions TinyRun() {
  TrainerOptions o;
  o.model = Tiny();
  o.steps = 6;
  o.global_batch = 4;
  o.micro_batch = 2;
  o.warmup_steps = 2;
  o.eval_batches = 0;
  o.sample_tokens = 0;
  o.log_every = 100;
  o.threads = 1;
  return o;
}

Result<TrainSummary> RunWith(const TrainerOptions& o,
                             const std::map<std::string, std::string>& env) {
  Result<std::unique_ptr<Session>> session =
      Session::FromEnvironment([&](const char* name) -> const char* {
        auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
      });
  if (!session.ok()) return session.status();
  return Train(o, DistEnv{}, session->get());
}

// Evaluation reads the model and nothing else: the parameters after a run
// with an evaluation every other step are those of a run without.
TEST(Train, PeriodicEvaluationLeavesTheParametersAsTheyWere) {
  Result<TrainSummary> plain = RunWith(TinyRun(), {});
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  TrainerOptions with_eval = TinyRun();
  with_eval.eval_every = 2;
  with_eval.eval_steps = 3;
  Result<TrainSummary> evaluated = RunWith(with_eval, {});
  ASSERT_TRUE(evaluated.ok()) << evaluated.status().ToString();
  EXPECT_EQ(evaluated->fingerprint, plain->fingerprint);
  EXPECT_EQ(evaluated->final_loss, plain->final_loss);
}

// An injected bitflip corrupts the parameters of this replica for good.
TEST(Train, BitflipChangesTheParameters) {
  Result<TrainSummary> plain = RunWith(TinyRun(), {});
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  Result<TrainSummary> flipped =
      RunWith(TinyRun(), {{"ENDURE_FAULTS", R"([{"id":"b","kind":"bitflip","rank":0,"step":3}])"},
                          {"ENDURE_SDC_CHECK_EVERY", "1"}});
  ASSERT_TRUE(flipped.ok()) << flipped.status().ToString();
  EXPECT_NE(flipped->fingerprint, plain->fingerprint);
}

}  // namespace
// A step whose peer died is abandoned at its next block or gradient:
// forward and backward throw StepStopped (through the autograd engine, type
// intact) once `stop` says so, and compute normally before; a forward pass
// without gradients (validation, sampling) is not stopped.
TEST(GPT, StepsStopAtTheirNextBlockOrGradientWhenAsked) {
  torch::manual_seed(0);
  GPT model(Tiny());
  const int params = static_cast<int>(model->parameters().size());
  int asked = 0;
  int stop_after = -1;  // how many asks say "go on" (-1: all of them)
  model->StopStepsWhen([&] { return stop_after >= 0 && asked++ >= stop_after; });
  torch::Tensor x = torch::randint(0, 256, {2, 16}, torch::kLong);
  model->Loss(x, x).backward();
  for (const auto& p : model->parameters()) EXPECT_TRUE(p.grad().defined());

  // In the forward pass: before its second block.
  model->zero_grad();
  asked = 0;
  stop_after = 1;
  EXPECT_THROW(model->Loss(x, x), StepStopped);
  EXPECT_EQ(asked, 2);

  // In the backward pass: at its first gradient, after both blocks' asks.
  asked = 0;
  stop_after = Tiny().layers;
  torch::Tensor loss = model->Loss(x, x);
  EXPECT_THROW(loss.backward(), StepStopped);
  EXPECT_EQ(asked, Tiny().layers + 1);
  EXPECT_LT(asked, Tiny().layers + params);

  // Without gradients, forward is never stopped.
  asked = 0;
  stop_after = 0;
  torch::NoGradGuard no_grad;
  EXPECT_NO_THROW(model->Loss(x, x));
}

}  // namespace endure::trainer
