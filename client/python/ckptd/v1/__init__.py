"""Generated gRPC and protobuf stubs of ckptd/v1/ckptd.proto (scripts/gen-python-stubs.sh)."""
