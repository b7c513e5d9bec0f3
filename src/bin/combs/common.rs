//! Options shared by the subcommands that load a model: which file (the
//! default model from the cache when none is given) and which device.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use combs::ModelError;
use combs::gpu::GpuContext;
use combs::models::{LoadOptions, Placement, SplitMode};
use combs::ops::act_round::Numerics;
use combs::ops::plan::{Backend, Fusion, IntDot};
use combs::quant::quantized_linear::LoadQuant;
use combs::runtime::Model;
use combs::runtime::model::default_model_path;

use crate::CliError;

/// Model and device selection.
#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// GGUF model file or Hugging Face model directory (config.json,
    /// *.safetensors, tokenizer.json; default: SmolLM2-135M-Instruct from
    /// the model cache).
    #[arg(short = 'm', long = "model", value_name = "FILE|DIR")]
    pub model: Option<PathBuf>,
    /// Vulkan device index, or `cpu` for the native kernels on the CPU
    /// (see `combs info --devices`; default: COMBS_DEVICE or the first GPU).
    #[arg(long, value_name = "N|cpu", value_parser = parse_device, conflicts_with = "devices")]
    pub device: Option<usize>,
    /// Several Vulkan devices, comma-separated (`0,1`): the model split by
    /// layers over them, or one replica on each (`--split-mode`). An index
    /// may repeat (the same device opened twice, for tests on one GPU).
    #[arg(long, value_name = "N,N,...", value_delimiter = ',', value_parser = parse_device)]
    pub devices: Vec<usize>,
    /// Each device's share of the blocks with `--devices` (`0.5,0.5`, as
    /// llama.cpp's `--tensor-split`; default: by each device's free memory).
    #[arg(
        long,
        value_name = "F,F,...",
        value_delimiter = ',',
        requires = "devices"
    )]
    pub split: Vec<f32>,
    /// With `--devices`: `layer` (contiguous blocks per device, a model
    /// too big for one) or `replica` (a whole model per device, sessions
    /// spread over them, for throughput).
    #[arg(long, value_name = "layer|replica", default_value = "layer", value_parser = parse_split_mode)]
    pub split_mode: SplitMode,
    /// Replicas: which device a new session goes to.
    #[arg(long, value_enum, default_value = "round-robin")]
    pub placement: PlacementArg,
    /// Kernels: `auto` (native on CPU devices, Vulkan elsewhere), `vulkan`
    /// or `host` (native; a CPU device only).
    #[arg(long, value_enum, default_value = "auto")]
    pub kernels: KernelsArg,
    /// Linear-layer numerics: `exact` (default) or `llama.cpp` (round
    /// activations as llama.cpp's CPU backend does, to compare outputs).
    #[arg(long, value_name = "MODE", default_value = "exact", value_parser = parse_numerics)]
    pub numerics: Numerics,
    /// Record every step as a kernel of its own (no norm, rope, gate or
    /// K/V store folded into another kernel; as COMBS_DISABLE_FUSION=1).
    #[arg(long)]
    pub no_fusion: bool,
    /// Under `--numerics llama.cpp`, decode products of Q4_0 / Q8_0 weights
    /// quantize their input to 8-bit blocks and multiply with integer dot
    /// products: `auto` (where the device reports them accelerated), `on`
    /// (wherever it runs them) or `off` (act_round and the f32 matvec).
    #[arg(long, value_name = "auto|on|off", default_value = "auto", value_parser = parse_int_dot)]
    pub int_dot: IntDot,
    /// Convert the weights while loading: `q4` (4-bit groups of 32 with a
    /// scale and a minimum, GGUF Q4_1, as `llama-quantize … Q4_1`), `f16`
    /// or `bf16` (default: as stored).
    #[arg(long, value_name = "q4|f16|bf16", value_parser = parse_quant)]
    pub quant: Option<LoadQuant>,
    /// Device-memory budget in MiB for everything this command allocates
    /// (weights, KV caches, scratch, staging; default: none). Past it, the
    /// load or session fails with an out-of-memory error naming what did
    /// not fit.
    #[arg(long, value_name = "MIB")]
    pub memory_budget: Option<u64>,
}

fn parse_split_mode(s: &str) -> Result<SplitMode, String> {
    SplitMode::parse(s).map_err(|e| e.to_string())
}

/// Which replica a new session goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PlacementArg {
    /// Each device in turn.
    RoundRobin,
    /// The device with the most free memory.
    FreeMemory,
}

fn parse_quant(s: &str) -> Result<LoadQuant, String> {
    LoadQuant::parse(s).map_err(|e| e.to_string())
}

/// A device index or `cpu`.
pub fn parse_device(s: &str) -> Result<usize, String> {
    combs::gpu::parse_device(s).map_err(|e| e.to_string())
}

/// Which kernels record a model's steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum KernelsArg {
    /// Native kernels on CPU devices, Vulkan elsewhere.
    Auto,
    /// Vulkan dispatches everywhere.
    Vulkan,
    /// The native kernels (a CPU device only).
    Host,
}

impl KernelsArg {
    /// The backend these kernels ask for (`None`: the device's default).
    pub fn backend(self) -> Option<Backend> {
        match self {
            KernelsArg::Auto => None,
            KernelsArg::Vulkan => Some(Backend::Vulkan),
            KernelsArg::Host => Some(Backend::Host),
        }
    }
}

fn parse_int_dot(s: &str) -> Result<IntDot, String> {
    IntDot::parse(s).map_err(|e| e.to_string())
}

fn parse_numerics(s: &str) -> Result<Numerics, String> {
    Numerics::parse(s).map_err(|e| e.to_string())
}

impl ModelArgs {
    /// The model path: the argument, else the default model, which must exist.
    pub fn path(&self) -> Result<PathBuf, CliError> {
        if let Some(p) = &self.model {
            return Ok(p.clone());
        }
        let p = default_model_path();
        if !p.exists() {
            return Err(CliError::Model(ModelError::Io {
                path: p,
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "default model not found; run scripts/fetch-models.sh or pass -m FILE",
                ),
            }));
        }
        Ok(p)
    }

    /// How the model (and a projector beside it) is loaded.
    pub fn load_options(&self) -> LoadOptions {
        LoadOptions {
            show_progress: true,
            numerics: self.numerics,
            fusion: if self.no_fusion {
                Fusion::Off
            } else {
                Fusion::On
            },
            plan_as: None,
            backend: self.kernels.backend(),
            quant: self.quant,
            int_dot: self.int_dot,
            split_mode: self.split_mode,
            tensor_split: self.split.clone(),
            placement: match self.placement {
                PlacementArg::RoundRobin => Placement::RoundRobin,
                PlacementArg::FreeMemory => Placement::MostFreeMemory,
            },
            layers: None,
        }
    }

    /// Opens the device and loads the model (with a progress bar on a terminal).
    pub fn load(&self) -> Result<(Arc<GpuContext>, Model), CliError> {
        let path = self.path()?;
        let ctxs = {
            let _t = combs::gpu::phases::time(combs::gpu::phases::Phase::Context);
            if self.devices.is_empty() {
                vec![GpuContext::new(self.device)?]
            } else {
                let opened: Result<Vec<_>, _> = self
                    .devices
                    .iter()
                    .map(|&i| GpuContext::new(Some(i)))
                    .collect();
                opened?
            }
        };
        if let Some(mib) = self.memory_budget {
            for ctx in &ctxs {
                ctx.set_memory_budget(mib.saturating_mul(1 << 20));
            }
        }
        let model = Model::load_on(&ctxs, &path, &self.load_options())
            .map_err(|e| CliError::in_file(&path, e))?;
        let ctx = ctxs
            .into_iter()
            .next()
            .ok_or_else(|| CliError::Model(ModelError::invalid("devices", "none given")))?;
        Ok((ctx, model))
    }
}
