"""embed_service: 768-dimension sentence embeddings over gRPC, batched dynamically."""
