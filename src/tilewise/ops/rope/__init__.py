"""Rotary position embeddings (RoPE) on queries and keys, as Hugging Face's apply_rotary_pos_emb."""
