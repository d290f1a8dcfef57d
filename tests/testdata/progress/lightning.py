import sys, torch, lightning as L
from torch.utils.data import DataLoader, TensorDataset
class M(L.LightningModule):
    def __init__(self):
        super().__init__(); self.l = torch.nn.Linear(8, 1)
    def training_step(self, b, i):
        x, y = b; loss = torch.nn.functional.mse_loss(self.l(x), y); self.log("train_loss", loss, prog_bar=True); return loss
    def validation_step(self, b, i):
        x, y = b; self.log("val_loss", torch.nn.functional.mse_loss(self.l(x), y))
    def configure_optimizers(self): return torch.optim.AdamW(self.parameters(), lr=1e-2)
g = torch.Generator().manual_seed(0)
ds = TensorDataset(torch.randn(320, 8, generator=g), torch.randn(320, 1, generator=g))
dl = DataLoader(ds, batch_size=16)  # 20 batches an epoch
t = L.Trainer(max_steps=50, accelerator="cpu", devices=1, logger=False, val_check_interval=10,
              default_root_dir=sys.argv[1], enable_model_summary=False)
t.fit(M(), dl, DataLoader(ds, batch_size=64))
