"""The policy network and its tokenizer: building, loading and saving them."""
