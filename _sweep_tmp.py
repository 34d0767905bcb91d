# temporary hyper-parameter sweep on the GPU (deleted after use)
import sys, json, dataclasses, time, torch, os
from pathlib import Path
from transformers import AutoConfig, AutoModelForCausalLM
from dflashx.tiny import build, corpus, train
from dflashx.tiny.tokenizer import train_tokenizer
name, variant, over, kw = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
s = dataclasses.replace(build.BuildSettings.for_variant(variant), **kw)
torch.manual_seed(0)
exs = corpus.examples("train", s.train_examples, 0)
out = Path(os.environ["OUT"]) / name; out.mkdir(parents=True)
tok = train_tokenizer(build._tokenizer_texts(exs, 0), 1024, out)
data = train.encode_corpus(tok, exs, 0, s.thinking_off_share)
cfg = {**build.model_config(variant), **over}
cfg.pop("architectures")
model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg)).cuda()
t = time.time()
st = train.train(model, data, steps=s.steps, batch_size=s.batch_size, lr=s.lr, seed=0, pad_id=tok.pad_token_id)
ev = train.evaluate(model, tok, corpus.examples("eval", 96, 0), True, 200, 0)
r = {"name": name, "over": over, "kw": kw, "train": st, "gpu_s": round(time.time() - t), "acc": ev["overall"],
     "fam": {k: v["accuracy"] for k, v in ev["per_family"].items()}}
print(json.dumps(r), flush=True)
