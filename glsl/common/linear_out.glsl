// The epilogue every linear kernel shares: D[o] = v (+ bias[row_offset + row])
// (+ D[o]) as p.flags says (1: accumulate into D, 2: add the bias). Needs
// the D and B bindings (data_d, data_bias) and p.flags / p.row_offset.

void store_linear(uint o, uint row, float v) {
    if ((p.flags & 2u) != 0u) {
        v += data_bias[p.row_offset + row];
    }
    if ((p.flags & 1u) != 0u) {
        v += data_d[o];
    }
    data_d[o] = v;
}
