"""Generated CRI (runtime.v1 subset) modules; see protos/tests/e2e/cri/runtime.proto."""
