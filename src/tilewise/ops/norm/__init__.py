"""Normalizations over the last dimension: RMSNorm (Llama, Mistral, Qwen2; Gemma's offset weight)."""
