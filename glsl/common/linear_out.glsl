// The epilogue every linear kernel shares: D[o] = v (+ bias[row_offset + row])
// (+ D[o]) as p.flags says (LINEAR_ACCUMULATE, LINEAR_BIAS). Needs
// the D and B bindings (data_d, data_bias) and p.flags / p.row_offset.
// with_bias and store_result are its two halves, for kernels that transform
// the biased value before storing it (matvec's rope and gated outputs).

// Rows past p.m (a workgroup's spare rows, a gated pair's missing partner)
// read no bias: their values are never stored, and the bias has m entries.
float with_bias(uint row, float v) {
    if ((p.flags & LINEAR_BIAS) != 0u && row < p.m) {
        v += data_bias[p.row_offset + row];
    }
    return v;
}

// Returns the value stored.
float store_result(uint o, float v) {
    if ((p.flags & LINEAR_ACCUMULATE) != 0u) {
        v += data_d[o];
    }
    data_d[o] = v;
    return v;
}

void store_linear(uint o, uint row, float v) {
    store_result(o, with_bias(row, v));
}
