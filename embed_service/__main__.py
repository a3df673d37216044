"""`python -m embed_service`: run the embedding service."""

from embed_service.main import main

if __name__ == "__main__":
    main()
