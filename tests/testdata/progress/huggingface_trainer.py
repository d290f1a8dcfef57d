import sys, torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
class DS(torch.utils.data.Dataset):
    def __init__(self, n): g = torch.Generator().manual_seed(0); self.x = torch.randint(0, 64, (n, 16), generator=g)
    def __len__(self): return len(self.x)
    def __getitem__(self, i): return {"input_ids": self.x[i], "labels": self.x[i]}
m = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2))
args = TrainingArguments(output_dir=sys.argv[1], max_steps=60, per_device_train_batch_size=8, save_steps=20,
                         eval_strategy="steps", eval_steps=25, logging_steps=10, report_to=[], use_cpu=True)
Trainer(model=m, args=args, train_dataset=DS(400), eval_dataset=DS(64)).train(resume_from_checkpoint=len(sys.argv) > 2)
