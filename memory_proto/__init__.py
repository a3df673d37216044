"""Generated gRPC code for proto/memory/v1; run proto/generate.py."""
