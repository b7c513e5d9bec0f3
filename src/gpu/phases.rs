//! Where model loading spends its time: wall-clock totals per phase (file
//! open, repack into staging, staging waits, allocation, pipeline creation,
//! ...), summed over the whole process and printed by `combs bench` when
//! `COMBS_LOAD_PROFILE=1`. Off by default; then a timer costs one relaxed
//! load of a flag.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// A phase of loading a model and producing its first token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Creating the Vulkan instance and device.
    Context,
    /// Opening and parsing the GGUF file (mmap, header, metadata).
    Open,
    /// Building the tokenizer from the file's vocabulary.
    Tokenizer,
    /// Allocating device buffers for weights.
    Alloc,
    /// Repacking GGUF blocks into the device layout, into staging (or
    /// straight into host-visible device memory).
    Fill,
    /// Waiting for a staging slot's copy to finish before refilling it.
    Wait,
    /// Recording and submitting staging copies.
    Submit,
    /// Dequantizing small tensors (norms, biases) to f32 on the host.
    HostF32,
    /// Creating compute pipelines (shader compilation by the driver).
    Pipeline,
    /// The final flush of the staging ring at the end of a load.
    Flush,
    /// Recording a forward pass's commands (prefill chunks).
    Record,
    /// Submitting recorded work and waiting for the GPU to finish it.
    Execute,
    /// Surveying a call's pipelines and creating them in parallel (wall
    /// time; `pipeline` sums the threads' own).
    Survey,
    /// Part of `record`: creating a recording (command pool and buffer,
    /// fence, query pool).
    RecordSetup,
    /// Part of `record`: a dispatch's Vulkan calls (descriptor set
    /// allocated and written, pipeline and set bound, push constants,
    /// the dispatch).
    RecordDispatch,
    /// Part of `record`: a streaming recording's submissions of its pieces.
    RecordSubmit,
    /// A call's inputs before recording: token ids and positions written,
    /// cache room reserved.
    Inputs,
    /// Reading a call's logits back to the host.
    Readout,
}

const PHASES: [Phase; 18] = [
    Phase::Context,
    Phase::Open,
    Phase::Tokenizer,
    Phase::Alloc,
    Phase::Fill,
    Phase::Wait,
    Phase::Submit,
    Phase::HostF32,
    Phase::Pipeline,
    Phase::Flush,
    Phase::Record,
    Phase::Execute,
    Phase::Survey,
    Phase::RecordSetup,
    Phase::RecordDispatch,
    Phase::RecordSubmit,
    Phase::Inputs,
    Phase::Readout,
];

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Context => "context",
            Phase::Open => "open",
            Phase::Tokenizer => "tokenizer",
            Phase::Alloc => "alloc",
            Phase::Fill => "fill",
            Phase::Wait => "wait",
            Phase::Submit => "submit",
            Phase::HostF32 => "host_f32",
            Phase::Pipeline => "pipeline",
            Phase::Flush => "flush",
            Phase::Record => "record",
            Phase::Execute => "execute",
            Phase::Survey => "survey",
            Phase::RecordSetup => "rec_setup",
            Phase::RecordDispatch => "rec_vk",
            Phase::RecordSubmit => "rec_submit",
            Phase::Inputs => "inputs",
            Phase::Readout => "readout",
        }
    }
}

static NANOS: [AtomicU64; PHASES.len()] = [const { AtomicU64::new(0) }; PHASES.len()];
static COUNTS: [AtomicU64; PHASES.len()] = [const { AtomicU64::new(0) }; PHASES.len()];
static BYTES: [AtomicU64; PHASES.len()] = [const { AtomicU64::new(0) }; PHASES.len()];

/// Whether phase timing is on (`COMBS_LOAD_PROFILE` set to anything but `0`).
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("COMBS_LOAD_PROFILE").is_some_and(|v| v != "0"))
}

/// Times one occurrence of a phase until dropped (nothing when timing is off).
pub struct PhaseTimer {
    phase: Phase,
    start: Option<Instant>,
    bytes: u64,
}

impl PhaseTimer {
    /// Counts `bytes` as this occurrence's volume (for a GB/s figure).
    pub fn bytes(mut self, bytes: u64) -> Self {
        self.bytes = bytes;
        self
    }
}

impl Drop for PhaseTimer {
    fn drop(&mut self) {
        if let Some(start) = self.start {
            let i = self.phase as usize;
            NANOS[i].fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
            COUNTS[i].fetch_add(1, Ordering::Relaxed);
            BYTES[i].fetch_add(self.bytes, Ordering::Relaxed);
        }
    }
}

/// Starts timing `phase`.
pub fn time(phase: Phase) -> PhaseTimer {
    PhaseTimer {
        phase,
        start: enabled().then(Instant::now),
        bytes: 0,
    }
}

/// The totals so far, one line per phase that occurred: milliseconds,
/// occurrences, and bytes with their rate where counted.
pub fn report() -> String {
    let mut s = String::new();
    for p in PHASES {
        let i = p as usize;
        let n = COUNTS[i].load(Ordering::Relaxed);
        if n == 0 {
            continue;
        }
        let ms = NANOS[i].load(Ordering::Relaxed) as f64 / 1e6;
        let bytes = BYTES[i].load(Ordering::Relaxed);
        s.push_str(&format!("  {:<10} {ms:>9.1} ms  {n:>6}x", p.name()));
        if bytes > 0 {
            let gib = bytes as f64 / (1u64 << 30) as f64;
            s.push_str(&format!(
                "  {:>8.1} MiB  {:>6.2} GiB/s",
                gib * 1024.0,
                gib / (ms / 1e3).max(1e-9)
            ));
        }
        s.push('\n');
    }
    s
}
