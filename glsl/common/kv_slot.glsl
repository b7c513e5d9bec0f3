// The cache row holding the key/value of position j of a sequence whose page
// table starts at page_table[base]. A contiguous cache is one page of
// page_size = its capacity; a ring cache (sliding-window layers keeping only
// the window) first folds j modulo `ring`. Requires `int page_table[]`.

uint kv_slot(int base, int j, uint page_size, uint ring) {
    uint pj = uint(j);
    if (ring > 0u) {
        pj %= ring;
    }
    return uint(page_table[base + int(pj / page_size)]) * page_size + pj % page_size;
}
