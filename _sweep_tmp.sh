export OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore TRANSFORMERS_VERBOSITY=error
S=_sweep_tmp.py
r(){ python $S "$@" >> $OUT/res.jsonl 2>>$OUT/err_$1.txt & }
r A tiny-qwen3 '{}' '{"steps":600}'
r B tiny-qwen3 '{}' '{"steps":1000}'
r C tiny-qwen3 '{}' '{"steps":1500}'
r D tiny-qwen3 '{}' '{"steps":1000,"lr":0.01}'
r E tiny-qwen3 '{"hidden_size":128,"num_attention_heads":4,"intermediate_size":384}' '{"steps":1000}'
r F tiny-qwen3 '{"hidden_size":128,"num_attention_heads":4,"intermediate_size":384}' '{"steps":1500,"lr":0.005}'
r G tiny-qwen3 '{"hidden_size":256,"num_attention_heads":8,"intermediate_size":768}' '{"steps":1000,"lr":0.002}'
r H tiny-qwen3 '{}' '{"steps":1000,"batch_size":64}'
r I tiny-qwen3 '{}' '{"steps":2500}'
r J tiny-qwen3_5 '{}' '{"steps":1000}'
r K tiny-qwen3 '{"num_hidden_layers":5,"hidden_size":64,"num_attention_heads":2,"num_key_value_heads":1,"intermediate_size":192,"layer_types":null}' '{"steps":300,"lr":0.01,"train_examples":3000}'
r L tiny-qwen3 '{"num_hidden_layers":5,"hidden_size":64,"num_attention_heads":2,"num_key_value_heads":1,"intermediate_size":192,"layer_types":null}' '{"steps":600,"lr":0.01,"train_examples":3000}'
wait
cat $OUT/res.jsonl; tail -3 $OUT/err_*.txt | grep -v Warn | tail -30
