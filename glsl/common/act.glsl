// The gate activations of gated FFNs (llama.cpp ggml_silu / ggml_gelu
// numerics): act_silu(x) = x * sigmoid(x); act_gelu_tanh(x) with the tanh
// approximation.

float act_silu(float x) {
    return x / (1.0 + exp(-x));
}

float act_gelu_tanh(float x) {
    const float k = 0.7978845608028654; // sqrt(2 / pi)
    const float inner = k * x * (1.0 + 0.044715 * x * x);
    // tanh through exp keeps large |inner| finite on every driver.
    const float t = 1.0 - 2.0 / (exp(2.0 * inner) + 1.0);
    return 0.5 * x * (1.0 + t);
}
