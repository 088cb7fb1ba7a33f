"""Vision-language support: screenshots in, image embeddings into a conversation's KV cache."""
