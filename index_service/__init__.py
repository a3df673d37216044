"""Index service: per-organization FAISS indexes, sharded by rendezvous hashing, rebuilt from
PostgreSQL (the source of truth for every chunk vector)."""
