// Hand-off: a dispatch ordered after the one before it through memory, not
// through a pipeline barrier. A barrier between two dependent dispatches
// drains the GPU and starts the next grid from nothing (~4 µs on an H200
// per barrier, ~160 of them per decoded token of an 8B); without one, the
// driver launches the next grid while the last one finishes, and its
// workgroups wait here until every workgroup before has counted itself.
//
// Included before the kernel's body, which it names kernel_main(). With
// HANDOFF defined (and HANDOFF_BINDING, the first of the three bindings it
// adds after the kernel's own: build/kernels.rs), main() waits on slot
// `wait` (binding HANDOFF_BINDING: [count, done, workgroups, -]) until its `done`
// word is set, runs kernel_main(), then counts the workgroup in slot `own`
// (HANDOFF_BINDING + 1), whose last workgroup sets `done`. HCOHERENT
// qualifies what earlier dispatches of the chain wrote (activations, the
// new K/V rows, sums of squares): read past the SM's L1, which no barrier
// invalidates here.
// Without HANDOFF, kernel_main() is main() and HCOHERENT nothing.
//
// The wait is bounded (~1 s on an H200): a grid that never finishes (a
// driver that ran the waiters first on every SM) sets the fault word (binding
// HANDOFF_BINDING + 2, host-visible; a plain store, since atomics may not
// reach host memory) and goes on rather than hanging the device; the host
// checks the word after each submission and fails the call (ModelError::
// HandoffTimeout), turning hand-offs off for later recordings.

#ifdef HANDOFF
#ifndef HANDOFF_BINDING
#error "a hand-off twin needs HANDOFF_BINDING (build/kernels.rs)"
#endif
#extension GL_KHR_memory_scope_semantics : enable
#define HCOHERENT coherent
layout(binding = HANDOFF_BINDING) coherent buffer HandoffWait { uint handoff_wait[]; };
layout(binding = HANDOFF_BINDING + 1) coherent buffer HandoffOwn { uint handoff_own[]; };
layout(binding = HANDOFF_BINDING + 2) volatile coherent buffer HandoffFault { uint handoff_fault[]; };

// Every access to the slots is atomic (the fault word's are not: it lives
// in host memory, which atomics may not reach). NVIDIA's compiler read a
// volatile coherent word once and spun on that (the H100 timed out with
// the predecessor long finished); an atomicLoad never saw the injected
// stall on lavapipe: reads are atomicOr with 0.
uint handoff_load(uint i) {
    return atomicOr(handoff_wait[i], 0u);
}

const uint HANDOFF_MAX_SPINS = 1u << 22;

void kernel_main();

void main() {
    const uint total = gl_NumWorkGroups.x * gl_NumWorkGroups.y * gl_NumWorkGroups.z;
    if (gl_LocalInvocationIndex == 0u) {
        // Word 2 of the own slot: started, and of how many workgroups (what
        // a waiter that gives up reports).
        atomicExchange(handoff_own[2], total);
        uint spins = 0u;
        // Once one waiter gave up, the others do too (the word is read
        // every 256 spins).
        while (handoff_load(1u) == 0u && spins < HANDOFF_MAX_SPINS) {
            spins++;
            if ((spins & 255u) == 0u && handoff_fault[0] != 0u) {
                break;
            }
        }
        // Not "spins reached the bound": lavapipe left this loop after
        // 65535 iterations, whatever its condition said.
        if (handoff_load(1u) == 0u) {
            handoff_fault[1] = handoff_load(0u);
            handoff_fault[2] = handoff_load(2u);
            handoff_fault[0] = 1u;
        }
    }
    memoryBarrierBuffer();
    barrier();
    kernel_main();
    memoryBarrierBuffer();
    barrier();
    if (gl_LocalInvocationIndex == 0u) {
        if (atomicAdd(handoff_own[0], 1u) + 1u == total) {
            memoryBarrierBuffer();
            atomicExchange(handoff_own[1], 1u);
        }
    }
}
#else
#define HCOHERENT
#define kernel_main main
#endif
