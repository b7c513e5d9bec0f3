// Device layouts of every weight format (the `repack_*` functions in
// src/quant/ write them). A quantized tensor of `nb` blocks is stored as
// planes, one after another in one buffer of 32-bit words:
//
//   plane 0 .. plane N-1 : `PLANE<i>_WORDS` words per block, block b's words at
//                          plane_base(i, nb) + b * PLANE<i>_WORDS
//   scale plane          : N_SCALES f16 per block, the block's scales as GGUF
//                          stores them, packed two to a word
//
// so every quant plane is word-aligned and a block's quants can be read with
// wide loads; the scales take no more bytes than in the file. Dense types (f32, f16, bf16) are flat: element i lives in word
// i / ELEMS_PER_WORD.
//
// QK: weights per block. QWORDS: sum of the quant planes' words per block.

#if defined(DATA_A_F32)
#define QK 1
#define DENSE 1
#define ELEMS_PER_WORD 1
#elif defined(DATA_A_F16) || defined(DATA_A_BF16)
#define QK 1
#define DENSE 1
#define ELEMS_PER_WORD 2
#elif defined(DATA_A_Q4_0)
#define QK 32
#define PLANE0_WORDS 4   // qs: 32 nibbles
#define QWORDS 4
#define N_SCALES 1    // d
#elif defined(DATA_A_Q4_1)
#define QK 32
#define PLANE0_WORDS 4   // qs
#define QWORDS 4
#define N_SCALES 2    // d, m
#elif defined(DATA_A_Q5_0)
#define QK 32
#define PLANE0_WORDS 4   // qs: low 4 bits
#define PLANE1_WORDS 1   // qh: 5th bits
#define QWORDS 5
#define N_SCALES 1    // d
#elif defined(DATA_A_Q5_1)
#define QK 32
#define PLANE0_WORDS 4   // qs
#define PLANE1_WORDS 1   // qh
#define QWORDS 5
#define N_SCALES 2    // d, m
#elif defined(DATA_A_Q8_0)
#define QK 32
#define PLANE0_WORDS 8   // qs: 32 int8
#define QWORDS 8
#define N_SCALES 1    // d
#elif defined(DATA_A_Q2_K)
#define QK 256
#define PLANE0_WORDS 16  // qs: 256 x 2 bits
#define PLANE1_WORDS 4   // scales: 16 bytes, low nibble scale, high nibble min
#define QWORDS 20
#define N_SCALES 2    // d, dmin
#elif defined(DATA_A_Q3_K)
#define QK 256
#define PLANE0_WORDS 16  // qs: low 2 bits
#define PLANE1_WORDS 8   // hmask: high bit
#define PLANE2_WORDS 3   // scales: 12 bytes of packed 6-bit scales
#define QWORDS 27
#define N_SCALES 1    // d
#elif defined(DATA_A_Q4_K)
#define QK 256
#define PLANE0_WORDS 32  // qs
#define PLANE1_WORDS 3   // scales: 12 bytes of packed 6-bit scales and mins
#define QWORDS 35
#define N_SCALES 2    // d, dmin
#elif defined(DATA_A_Q5_K)
#define QK 256
#define PLANE0_WORDS 32  // qs: low 4 bits
#define PLANE1_WORDS 8   // qh: 5th bits
#define PLANE2_WORDS 3   // scales
#define QWORDS 43
#define N_SCALES 2    // d, dmin
#elif defined(DATA_A_Q6_K)
#define QK 256
#define PLANE0_WORDS 32  // ql: low 4 bits
#define PLANE1_WORDS 16  // qh: high 2 bits
#define PLANE2_WORDS 4   // scales: 16 int8
#define QWORDS 52
#define N_SCALES 1    // d
#else
#error "no DATA_A_* weight type defined"
#endif

#ifndef PLANE1_WORDS
#define PLANE1_WORDS 0
#endif
#ifndef PLANE2_WORDS
#define PLANE2_WORDS 0
#endif
