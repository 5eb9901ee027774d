"""Images and video for vision-language models: processors, placeholder expansion, M-RoPE positions."""
