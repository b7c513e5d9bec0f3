// The rotation of one rope pair, llama.cpp's ggml_rope_ext arithmetic:
// (x0, x1) turned by pos * freq, cos and sin scaled by attn_factor (YaRN /
// LongRoPE magnitude; 1 otherwise). The rope kernel, the matvec and the
// cooperative-matrix epilogue all rotate through it, so a rope folded into
// a product stores what rope.comp would have written.

vec2 rope_pair(float x0, float x1, int pos, float freq, float attn_factor) {
    const float theta = float(pos) * freq;
    const float c = cos(theta) * attn_factor;
    const float s = sin(theta) * attn_factor;
    return vec2(x0 * c - x1 * s, x0 * s + x1 * c);
}
