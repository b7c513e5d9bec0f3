//! `Recording`: a command buffer recorded once and submitted any number of
//! times. Recording is separate from submitting: ops append dispatches (never
//! submit or wait); the owner calls [`Recording::finish`] then
//! [`Recording::submit_and_wait`] per replay.
//!
//! A streaming recording ([`Recording::streaming`], for one-shot work such
//! as a prompt) submits its commands in pieces as it records them, so the
//! GPU starts on the first layers while the host records the rest.
//!
//! Hazards are tracked per buffer: a dispatch that reads or writes a buffer
//! written since the last barrier, or writes one read since then, gets a
//! memory barrier first whose destination is dispatches only; a copy, fill
//! or indirect read that touches a buffer accessed before such barriers gets
//! a full one. Independent dispatches (Q, K and V projections of one token,
//! say) therefore run without barriers between them.

use std::collections::HashSet;
use std::sync::Arc;

use ash::vk;
use rayon::prelude::*;

use super::binding::{Access, Binding, groups_1d};
use super::buffer::Buffer;
use super::context::GpuContext;
use super::host::{HostMem, HostStep};
use super::kernels::Kernel;
use super::pipeline::{Pipeline, get_pipeline};
use super::spare::{self, RecordingKit};
use super::wait::{WaitMode, wait_and_reset, wait_mode};
use crate::error::{ModelError, Result};

/// Invocations per workgroup of elementwise kernels.
pub const ELEMENTWISE_WG: u32 = 256;

const SETS_PER_POOL: u32 = 256;
const MAX_BINDINGS_PER_SET: u32 = 12;
const MAX_TIMESTAMPS: u32 = 2048;

/// A replayable command buffer and everything it references.
pub struct Recording {
    ctx: Arc<GpuContext>,
    pool: vk::CommandPool,
    /// The command buffer being recorded.
    cmd: vk::CommandBuffer,
    /// Whether `cmd` holds commands (a host step then ends it).
    dirty: bool,
    /// What a submission runs, in order.
    steps: Vec<Step>,
    /// Host time per step label of the last submission (with timestamps).
    host_times: Vec<(&'static str, f64)>,
    fence: vk::Fence,
    descriptor_pools: Vec<vk::DescriptorPool>,
    /// Reset descriptor pools of a recycled kit, used before new ones.
    spare_descriptor_pools: Vec<vk::DescriptorPool>,
    sets_in_current_pool: u32,
    keep_pipelines: Vec<Arc<Pipeline>>,
    keep_buffers: Vec<Arc<Buffer>>,
    kept: HashSet<vk::Buffer>,
    written: HashSet<vk::Buffer>,
    read: HashSet<vk::Buffer>,
    query_pool: Option<vk::QueryPool>,
    labels: Vec<String>,
    profile: bool,
    /// Pipeline stages of the commands recorded since the last barrier.
    stages_since_barrier: vk::PipelineStageFlags,
    finished: bool,
    n_dispatches: usize,
    n_barriers: usize,
    n_host_steps: usize,
    /// A survey ([`Recording::survey`]): the pipelines dispatches would
    /// use, collected instead of recorded.
    survey: Option<Vec<SurveyedPipeline>>,
    /// Buffers written / read before a barrier that ordered them for later
    /// dispatches only ([`Recording::barrier_for_dispatches`]): a later copy
    /// or indirect read of them still needs a barrier of its own.
    unordered_written: HashSet<vk::Buffer>,
    unordered_read: HashSet<vk::Buffer>,
    /// Pipeline stages of those accesses.
    unordered_stages: vk::PipelineStageFlags,
    /// Streaming submission ([`Recording::streaming`]), while it lasts.
    stream: Option<Stream>,
    /// Steps at the front of `steps` already submitted by streaming.
    streamed: usize,
    /// Whether submitted work has not been waited for yet (a fence-less
    /// streamed piece): it must finish before host steps run or the
    /// recording's resources go.
    unwaited: bool,
    /// A submission or wait failed part way: what was submitted may still
    /// be pending, so the pools are destroyed, not kept for reuse.
    in_doubt: bool,
}

/// When a streaming recording submits what it has recorded.
#[derive(Clone, Copy, Debug)]
struct Stream {
    /// Dispatches recorded into the current command buffer.
    pending: usize,
    /// Dispatches that make the next piece.
    next: usize,
}

impl Stream {
    /// The first piece: small, so the GPU starts soon; each later one twice
    /// as long, up to [`Stream::LONGEST`] (each submission costs the host
    /// ~10-30 µs, a dispatch's recording a few).
    const FIRST: usize = 4;
    const LONGEST: usize = 64;
}

/// What [`get_pipeline`] takes, as a survey collects it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct SurveyedPipeline {
    kernel: Kernel,
    spec: Vec<u32>,
    n_bindings: u32,
}

/// One piece of what a submission runs.
enum Step {
    /// A command buffer: submitted, then waited for.
    Commands(vk::CommandBuffer),
    /// Work on the host.
    Host(HostStep),
}

// SAFETY: the handles are owned by this value; Vulkan allows using them from any
// thread as long as access is externally synchronized, which `&mut self` ensures.
unsafe impl Send for Recording {}

impl Recording {
    /// Starts recording a new command buffer. `timestamps` reserves a query pool
    /// for [`Recording::timestamp`] and stamps the end of every dispatch with
    /// its kernel's name (ignored where the queue has no timestamps).
    ///
    /// # Errors
    /// A failing Vulkan call.
    pub fn new(ctx: &Arc<GpuContext>, timestamps: bool) -> Result<Self> {
        let mut rec = Self::with_query_pool(ctx, timestamps)?;
        rec.profile = timestamps;
        Ok(rec)
    }

    /// Starts recording with a query pool for [`Recording::timestamp`] but no
    /// stamp after each dispatch: for timing a stretch of work as a whole.
    ///
    /// # Errors
    /// A failing Vulkan call.
    pub fn timed(ctx: &Arc<GpuContext>) -> Result<Self> {
        Self::with_query_pool(ctx, true)
    }

    /// Starts a recording that submits its commands in pieces while it
    /// records (the first after a few dispatches, then longer ones), so the
    /// GPU runs the start of a long pass while the host records the rest:
    /// recording a prompt of llama-1b (146 dispatches) took the host 1.0 ms
    /// of a 12.2 ms pass on an H100 (`COMBS_LOAD_PROFILE=1 combs bench -p
    /// 512`), with the GPU idle. Only for work whose inputs are final when
    /// it is recorded and that is submitted at once: a piece runs as soon
    /// as it is recorded, and the first [`Recording::submit_and_wait`]
    /// does not run it again (a recording made ahead of its inputs, as
    /// Whisper's encoder is at load, must not stream). A piece may also
    /// already run when a later error drops the recording (which then
    /// waits for it). After a host step
    /// ([`Recording::host`]) the rest is submitted at
    /// [`Recording::submit_and_wait`], as in other recordings; replays
    /// submit every piece again.
    ///
    /// # Errors
    /// A failing Vulkan call.
    pub fn streaming(ctx: &Arc<GpuContext>) -> Result<Self> {
        let mut rec = Self::with_query_pool(ctx, false)?;
        rec.stream = Some(Stream {
            pending: 0,
            next: Stream::FIRST,
        });
        Ok(rec)
    }

    /// A recording that is never submitted and only collects the compute
    /// pipelines its dispatches would use (everything else it is given is
    /// recorded and dropped). [`Recording::create_surveyed_pipelines`] then
    /// creates the missing ones on several threads at once, where
    /// recording creates them one after another: a driver compiling
    /// cooperative-matrix kernels from a cold cache takes ~0.3 s each (an
    /// 8B's first prompt: 2.4 s on an H200).
    ///
    /// # Errors
    /// A failing Vulkan call.
    pub fn survey(ctx: &Arc<GpuContext>) -> Result<Self> {
        let mut rec = Self::with_query_pool(ctx, false)?;
        rec.survey = Some(Vec::new());
        Ok(rec)
    }

    /// Creates the pipelines a survey collected that do not exist yet, on
    /// the rayon pool's threads; returns how many it collected.
    ///
    /// # Errors
    /// Not a survey, or a pipeline that fails to build.
    pub fn create_surveyed_pipelines(mut self) -> Result<usize> {
        let Some(mut keys) = self.survey.take() else {
            return Err(ModelError::Internal("not a pipeline survey".into()));
        };
        keys.sort_by(|a, b| {
            (a.kernel.name(), &a.spec, a.n_bindings).cmp(&(b.kernel.name(), &b.spec, b.n_bindings))
        });
        keys.dedup();
        let ctx = self.ctx.clone();
        keys.par_iter()
            .map(|k| {
                let subgroup = k.spec.get(1).copied().filter(|&s| s > 0);
                get_pipeline(&ctx, k.kernel, &k.spec, k.n_bindings, subgroup).map(|_| ())
            })
            .collect::<Result<Vec<()>>>()?;
        Ok(keys.len())
    }

    fn with_query_pool(ctx: &Arc<GpuContext>, timestamps: bool) -> Result<Self> {
        ctx.check_alive()?;
        let _t = super::phases::time(super::phases::Phase::RecordSetup);
        let dev = ctx.device();
        let kit = ctx.spare_kits.take();
        let pool = match &kit {
            Some(k) => k.pool,
            None => ctx.create_command_pool()?,
        };
        let mut rec = Recording {
            ctx: ctx.clone(),
            pool,
            cmd: vk::CommandBuffer::null(),
            dirty: false,
            steps: Vec::new(),
            host_times: Vec::new(),
            fence: vk::Fence::null(),
            descriptor_pools: Vec::new(),
            spare_descriptor_pools: Vec::new(),
            sets_in_current_pool: SETS_PER_POOL,
            keep_pipelines: Vec::new(),
            keep_buffers: Vec::new(),
            kept: HashSet::new(),
            written: HashSet::new(),
            read: HashSet::new(),
            query_pool: None,
            labels: Vec::new(),
            profile: false,
            stages_since_barrier: vk::PipelineStageFlags::empty(),
            finished: false,
            n_dispatches: 0,
            n_barriers: 0,
            n_host_steps: 0,
            survey: None,
            unordered_written: HashSet::new(),
            unordered_read: HashSet::new(),
            unordered_stages: vk::PipelineStageFlags::empty(),
            stream: None,
            streamed: 0,
            unwaited: false,
            in_doubt: false,
        };
        match kit {
            Some(k) => {
                rec.fence = k.fence;
                rec.spare_descriptor_pools = k.descriptor_pools;
            }
            // SAFETY: valid device.
            None => {
                rec.fence = unsafe { dev.create_fence(&vk::FenceCreateInfo::default(), None) }
                    .map_err(|r| ModelError::vk("vkCreateFence", r))?;
            }
        }
        if timestamps && ctx.caps().timestamp_period_ns.is_some() {
            let info = vk::QueryPoolCreateInfo::default()
                .query_type(vk::QueryType::TIMESTAMP)
                .query_count(MAX_TIMESTAMPS);
            // SAFETY: valid device.
            rec.query_pool = Some(
                unsafe { dev.create_query_pool(&info, None) }
                    .map_err(|r| ModelError::vk("vkCreateQueryPool", r))?,
            );
        }
        rec.begin_commands()?;
        if let Some(q) = rec.query_pool {
            // SAFETY: recording state; the pool is ours.
            unsafe { dev.cmd_reset_query_pool(rec.cmd, q, 0, MAX_TIMESTAMPS) };
            rec.dirty = true;
        }
        Ok(rec)
    }

    /// Allocates and begins the next command buffer.
    fn begin_commands(&mut self) -> Result<()> {
        let dev = self.ctx.device();
        let alloc = vk::CommandBufferAllocateInfo::default()
            .command_pool(self.pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        // SAFETY: the pool is ours.
        self.cmd = unsafe { dev.allocate_command_buffers(&alloc) }
            .map_err(|r| ModelError::vk("vkAllocateCommandBuffers", r))?[0];
        // SAFETY: cmd is freshly allocated and not in use.
        unsafe { dev.begin_command_buffer(self.cmd, &vk::CommandBufferBeginInfo::default()) }
            .map_err(|r| ModelError::vk("vkBeginCommandBuffer", r))?;
        self.dirty = false;
        Ok(())
    }

    /// Ends the command buffer being recorded (GPU writes visible to the
    /// host after it) and queues it as the next step, if it holds commands.
    fn end_commands(&mut self) -> Result<()> {
        if !self.dirty {
            return Ok(());
        }
        let dev = self.ctx.device();
        // SAFETY: recording state.
        unsafe {
            memory_barrier(
                dev,
                self.cmd,
                (
                    vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER,
                    vk::AccessFlags::SHADER_WRITE | vk::AccessFlags::TRANSFER_WRITE,
                ),
                (vk::PipelineStageFlags::HOST, vk::AccessFlags::HOST_READ),
            );
            dev.end_command_buffer(self.cmd)
        }
        .map_err(|r| ModelError::vk("vkEndCommandBuffer", r))?;
        self.steps.push(Step::Commands(self.cmd));
        self.written.clear();
        self.read.clear();
        self.unordered_written.clear();
        self.unordered_read.clear();
        self.unordered_stages = vk::PipelineStageFlags::empty();
        self.stages_since_barrier = vk::PipelineStageFlags::empty();
        self.dirty = false;
        Ok(())
    }

    /// Records `step` to run on the host, after everything recorded before
    /// it and before everything after.
    ///
    /// # Errors
    /// A finished recording, or a failing Vulkan call.
    pub fn host(&mut self, step: HostStep) -> Result<()> {
        self.check_open()?;
        // Host steps run at submission, between pieces waited for there.
        self.stream = None;
        if self.dirty {
            self.end_commands()?;
            self.begin_commands()?;
        }
        self.steps.push(Step::Host(step));
        self.n_host_steps += 1;
        Ok(())
    }

    /// The context this recording belongs to.
    pub fn context(&self) -> &Arc<GpuContext> {
        &self.ctx
    }

    fn keep(&mut self, b: &Arc<Buffer>) {
        if self.kept.insert(b.raw()) {
            self.keep_buffers.push(b.clone());
        }
    }

    fn check_open(&self) -> Result<()> {
        if self.finished {
            return Err(ModelError::Internal(
                "recording into a finished command buffer".into(),
            ));
        }
        Ok(())
    }

    /// Inserts a full compute/transfer memory barrier now.
    pub fn barrier(&mut self) {
        self.stages_since_barrier |=
            vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER;
        self.barrier_since();
    }

    /// A barrier after the commands recorded since the last one (and those
    /// before earlier barriers that ordered them for dispatches only): its
    /// source scope is only the stages they used, its destination
    /// everything later, since hazard tracking starts afresh after it.
    fn barrier_since(&mut self) {
        self.dirty = true;
        let (src, src_access) = source_scope(self.stages_since_barrier | self.unordered_stages);
        let dst_access = vk::AccessFlags::SHADER_READ
            | vk::AccessFlags::SHADER_WRITE
            | vk::AccessFlags::TRANSFER_READ
            | vk::AccessFlags::TRANSFER_WRITE
            | vk::AccessFlags::INDIRECT_COMMAND_READ;
        let dst = vk::PipelineStageFlags::COMPUTE_SHADER
            | vk::PipelineStageFlags::TRANSFER
            | vk::PipelineStageFlags::DRAW_INDIRECT;
        // SAFETY: cmd is in the recording state (checked by callers).
        unsafe {
            memory_barrier(
                self.ctx.device(),
                self.cmd,
                (src, src_access),
                (dst, dst_access),
            )
        };
        self.written.clear();
        self.read.clear();
        self.unordered_written.clear();
        self.unordered_read.clear();
        self.unordered_stages = vk::PipelineStageFlags::empty();
        self.stages_since_barrier = vk::PipelineStageFlags::empty();
        self.n_barriers += 1;
    }

    /// A barrier that orders the commands recorded since the last one
    /// before later dispatches only. Between two dispatches this is what
    /// NVIDIA's driver runs fastest: a barrier whose destination also
    /// names the transfer and indirect-command stages cost ~3 µs more per
    /// dependent dispatch on the H200 (llama-1b decode 957 → 1169 tokens/s,
    /// SmolLM2 777 → 1074 with this one). The accesses stay tracked for
    /// later copies and indirect reads, which get a full barrier.
    fn barrier_for_dispatches(&mut self) {
        self.dirty = true;
        let (src, src_access) = source_scope(self.stages_since_barrier);
        let dst_access = vk::AccessFlags::SHADER_READ | vk::AccessFlags::SHADER_WRITE;
        // SAFETY: cmd is in the recording state (checked by callers).
        unsafe {
            memory_barrier(
                self.ctx.device(),
                self.cmd,
                (src, src_access),
                (vk::PipelineStageFlags::COMPUTE_SHADER, dst_access),
            )
        };
        self.unordered_written.extend(self.written.drain());
        self.unordered_read.extend(self.read.drain());
        self.unordered_stages |= src;
        self.stages_since_barrier = vk::PipelineStageFlags::empty();
        self.n_barriers += 1;
    }

    fn track(
        &mut self,
        reads: &[vk::Buffer],
        writes: &[vk::Buffer],
        stage: vk::PipelineStageFlags,
    ) {
        let conflicts = |written: &HashSet<vk::Buffer>, read: &HashSet<vk::Buffer>| {
            reads.iter().any(|b| written.contains(b))
                || writes
                    .iter()
                    .any(|b| written.contains(b) || read.contains(b))
        };
        let dispatch = stage == vk::PipelineStageFlags::COMPUTE_SHADER;
        if dispatch {
            if conflicts(&self.written, &self.read) {
                self.barrier_for_dispatches();
            }
        } else if conflicts(&self.written, &self.read)
            || conflicts(&self.unordered_written, &self.unordered_read)
        {
            self.barrier_since();
        }
        self.read.extend(reads.iter().copied());
        self.written.extend(writes.iter().copied());
        self.stages_since_barrier |= stage;
    }

    fn descriptor_set(&mut self, layout: vk::DescriptorSetLayout) -> Result<vk::DescriptorSet> {
        let dev = self.ctx.device().clone();
        if self.sets_in_current_pool >= SETS_PER_POOL
            && let Some(pool) = self.spare_descriptor_pools.pop()
        {
            self.descriptor_pools.push(pool);
            self.sets_in_current_pool = 0;
        }
        if self.sets_in_current_pool >= SETS_PER_POOL {
            let sizes = [vk::DescriptorPoolSize::default()
                .ty(vk::DescriptorType::STORAGE_BUFFER)
                .descriptor_count(SETS_PER_POOL * MAX_BINDINGS_PER_SET)];
            let info = vk::DescriptorPoolCreateInfo::default()
                .max_sets(SETS_PER_POOL)
                .pool_sizes(&sizes);
            // SAFETY: valid device.
            let pool = unsafe { dev.create_descriptor_pool(&info, None) }
                .map_err(|r| ModelError::vk("vkCreateDescriptorPool", r))?;
            self.descriptor_pools.push(pool);
            self.sets_in_current_pool = 0;
        }
        let pool = *self
            .descriptor_pools
            .last()
            .ok_or_else(|| ModelError::Internal("no descriptor pool".into()))?;
        let layouts = [layout];
        let info = vk::DescriptorSetAllocateInfo::default()
            .descriptor_pool(pool)
            .set_layouts(&layouts);
        // SAFETY: pool and layout are valid; the pool has room (counted above).
        let set = unsafe { dev.allocate_descriptor_sets(&info) }
            .map_err(|r| ModelError::vk("vkAllocateDescriptorSets", r))?[0];
        self.sets_in_current_pool += 1;
        Ok(set)
    }

    /// Records one dispatch of `kernel` with specialization constants `spec`,
    /// storage buffers `bindings` (binding i = `bindings[i]`), push constants
    /// `push` (at most 128 bytes) and `groups` workgroups.
    ///
    /// # Errors
    /// A binding range outside its buffer or too large for one descriptor, push
    /// constants too large, or a failing Vulkan call.
    pub fn dispatch(
        &mut self,
        kernel: Kernel,
        spec: &[u32],
        bindings: &[Binding<'_>],
        push: &[u8],
        groups: [u32; 3],
    ) -> Result<()> {
        if self.surveyed(kernel, spec, bindings) {
            return Ok(());
        }
        let t = super::phases::time(super::phases::Phase::RecordDispatch);
        let pipeline = self.prepare(kernel, spec, bindings, push)?;
        // SAFETY: recording state, pipeline bound by prepare().
        unsafe {
            self.ctx
                .device()
                .cmd_dispatch(self.cmd, groups[0], groups[1], groups[2])
        };
        drop(t);
        self.keep_pipelines.push(pipeline);
        self.stamp(kernel);
        self.stream_on()
    }

    /// In a streaming recording, submits the current command buffer once
    /// it holds the piece's dispatches and begins the next one. Hazard
    /// tracking carries on across the boundary: a barrier's first scope is
    /// every command earlier in submission order, so the next piece's
    /// barriers order it after this one.
    fn stream_on(&mut self) -> Result<()> {
        let Some(st) = self.stream.as_mut() else {
            return Ok(());
        };
        st.pending += 1;
        if st.pending < st.next {
            return Ok(());
        }
        st.pending = 0;
        st.next = (2 * st.next).min(Stream::LONGEST);
        let _t = super::phases::time(super::phases::Phase::RecordSubmit);
        let dev = self.ctx.device();
        // SAFETY: recording state.
        unsafe { dev.end_command_buffer(self.cmd) }
            .map_err(|r| ModelError::vk("vkEndCommandBuffer", r))?;
        self.steps.push(Step::Commands(self.cmd));
        // Counted as submitted even if the submission fails: a failed
        // vkQueueSubmit leaves nothing of it pending, and the recording
        // is unusable after an error anyway.
        self.streamed = self.steps.len();
        self.in_doubt = true;
        // SAFETY: ended above; everything it uses is kept alive by self,
        // whose drop waits for it.
        unsafe { self.ctx.submit(self.cmd, vk::Fence::null()) }?;
        self.in_doubt = false;
        self.unwaited = true;
        self.begin_commands()
    }

    /// Waits for everything submitted so far (fence-less streamed pieces
    /// included: a fence signal covers all earlier submissions).
    fn wait_unwaited(&mut self, mode: WaitMode) -> Result<()> {
        if !self.unwaited {
            return Ok(());
        }
        // SAFETY: an empty batch that only signals the (unsignaled) fence.
        unsafe { self.ctx.submit_empty(self.fence) }?;
        wait_and_reset(&self.ctx, self.fence, mode)?;
        self.unwaited = false;
        Ok(())
    }

    /// Records an elementwise dispatch: `threads` invocations in workgroups
    /// of [`ELEMENTWISE_WG`] (the kernel's specialization constant 0),
    /// folded into y where x would pass the device's limit ([`groups_1d`]),
    /// with `params` as push constants.
    ///
    /// # Errors
    /// As [`Recording::dispatch`].
    pub fn dispatch_elementwise<P: bytemuck::Pod>(
        &mut self,
        kernel: Kernel,
        bindings: &[Binding<'_>],
        params: &P,
        threads: u32,
    ) -> Result<()> {
        let groups = groups_1d(&self.ctx, threads.div_ceil(ELEMENTWISE_WG));
        let push = bytemuck::bytes_of(params);
        self.dispatch(kernel, &[ELEMENTWISE_WG], bindings, push, groups)
    }

    /// Like [`Recording::dispatch`], with the workgroup counts read by the GPU from
    /// three u32 at `offset` in `args` (so a replay can vary them).
    ///
    /// # Errors
    /// As [`Recording::dispatch`].
    pub fn dispatch_indirect(
        &mut self,
        kernel: Kernel,
        spec: &[u32],
        bindings: &[Binding<'_>],
        push: &[u8],
        args: &Arc<Buffer>,
        offset: u64,
    ) -> Result<()> {
        if self.surveyed(kernel, spec, bindings) {
            return Ok(());
        }
        if !offset.is_multiple_of(4) || offset + 12 > args.size() {
            return Err(ModelError::Internal(
                "indirect dispatch arguments out of range".into(),
            ));
        }
        // The indirect read happens before the dispatch runs, in its own
        // stage: any earlier write of the arguments needs a full barrier.
        self.track(&[args.raw()], &[], vk::PipelineStageFlags::DRAW_INDIRECT);
        self.keep(args);
        let pipeline = self.prepare(kernel, spec, bindings, push)?;
        // SAFETY: recording state, pipeline bound, args range checked.
        unsafe {
            self.ctx
                .device()
                .cmd_dispatch_indirect(self.cmd, args.raw(), offset)
        };
        self.keep_pipelines.push(pipeline);
        self.stamp(kernel);
        self.stream_on()
    }

    /// In a survey, notes the dispatch's pipeline and says so.
    fn surveyed(&mut self, kernel: Kernel, spec: &[u32], bindings: &[Binding<'_>]) -> bool {
        match &mut self.survey {
            Some(keys) => {
                keys.push(SurveyedPipeline {
                    kernel,
                    spec: spec.to_vec(),
                    n_bindings: bindings.len() as u32,
                });
                true
            }
            None => false,
        }
    }

    fn prepare(
        &mut self,
        kernel: Kernel,
        spec: &[u32],
        bindings: &[Binding<'_>],
        push: &[u8],
    ) -> Result<Arc<Pipeline>> {
        self.dirty = true;
        self.check_open()?;
        if push.len() > 128 || !push.len().is_multiple_of(4) {
            return Err(ModelError::Internal(format!(
                "{}: push constants of {} bytes",
                kernel.name(),
                push.len()
            )));
        }
        if bindings.len() > MAX_BINDINGS_PER_SET as usize {
            return Err(ModelError::Internal(format!(
                "{}: {} bindings",
                kernel.name(),
                bindings.len()
            )));
        }
        let caps = self.ctx.caps();
        let mut infos = Vec::with_capacity(bindings.len());
        let mut reads = Vec::new();
        let mut writes = Vec::new();
        for (i, b) in bindings.iter().enumerate() {
            let size = b.size.unwrap_or(b.buffer.size().saturating_sub(b.offset));
            let in_range = b
                .offset
                .checked_add(size)
                .is_some_and(|e| e <= b.buffer.size());
            if !in_range || size == 0 {
                return Err(ModelError::Internal(format!(
                    "{}: binding {i} range {}+{size} outside a {} byte buffer",
                    kernel.name(),
                    b.offset,
                    b.buffer.size()
                )));
            }
            if size > caps.max_storage_buffer_range {
                return Err(ModelError::Internal(format!(
                    "{}: binding {i} covers {size} bytes, above maxStorageBufferRange {}",
                    kernel.name(),
                    caps.max_storage_buffer_range
                )));
            }
            if b.offset % caps.storage_offset_alignment != 0 {
                return Err(ModelError::Internal(format!(
                    "{}: binding {i} offset {} not aligned to {}",
                    kernel.name(),
                    b.offset,
                    caps.storage_offset_alignment
                )));
            }
            infos.push(
                vk::DescriptorBufferInfo::default()
                    .buffer(b.buffer.raw())
                    .offset(b.offset)
                    .range(size),
            );
            match b.access {
                Access::Read => reads.push(b.buffer.raw()),
                Access::Write => writes.push(b.buffer.raw()),
            }
        }
        self.track(&reads, &writes, vk::PipelineStageFlags::COMPUTE_SHADER);
        for b in bindings {
            self.keep(b.buffer);
        }
        let pipeline = get_pipeline(
            &self.ctx,
            kernel,
            spec,
            bindings.len() as u32,
            spec.get(1).copied().filter(|&s| s > 0),
        )?;
        let set = self.descriptor_set(pipeline.set_layout)?;
        let writes_info: Vec<vk::WriteDescriptorSet> = infos
            .iter()
            .enumerate()
            .map(|(i, info)| {
                vk::WriteDescriptorSet::default()
                    .dst_set(set)
                    .dst_binding(i as u32)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .buffer_info(std::slice::from_ref(info))
            })
            .collect();
        let dev = self.ctx.device();
        // SAFETY: set, buffers and pipeline are valid and kept alive by self.
        unsafe {
            dev.update_descriptor_sets(&writes_info, &[]);
            dev.cmd_bind_pipeline(self.cmd, vk::PipelineBindPoint::COMPUTE, pipeline.raw);
            dev.cmd_bind_descriptor_sets(
                self.cmd,
                vk::PipelineBindPoint::COMPUTE,
                pipeline.layout,
                0,
                &[set],
                &[],
            );
            if !push.is_empty() {
                dev.cmd_push_constants(
                    self.cmd,
                    pipeline.layout,
                    vk::ShaderStageFlags::COMPUTE,
                    0,
                    push,
                );
            }
        }
        self.n_dispatches += 1;
        Ok(pipeline)
    }

    /// Copies `size` bytes between buffers.
    ///
    /// # Errors
    /// A range outside either buffer.
    pub fn copy(
        &mut self,
        src: &Arc<Buffer>,
        src_offset: u64,
        dst: &Arc<Buffer>,
        dst_offset: u64,
        size: u64,
    ) -> Result<()> {
        self.dirty = true;
        self.check_open()?;
        let ok = src_offset + size <= src.size() && dst_offset + size <= dst.size();
        if !ok || size == 0 {
            return Err(ModelError::Internal(format!(
                "copy of {size} bytes outside a buffer"
            )));
        }
        self.track(&[src.raw()], &[dst.raw()], vk::PipelineStageFlags::TRANSFER);
        self.keep(src);
        self.keep(dst);
        let region = [vk::BufferCopy::default()
            .src_offset(src_offset)
            .dst_offset(dst_offset)
            .size(size)];
        // SAFETY: recording state; both buffers kept alive; ranges checked.
        unsafe {
            self.ctx
                .device()
                .cmd_copy_buffer(self.cmd, src.raw(), dst.raw(), &region)
        };
        Ok(())
    }

    /// Fills `size` bytes (a multiple of 4) at `offset` with the 32-bit `value`.
    ///
    /// # Errors
    /// A range outside the buffer or not a multiple of 4.
    pub fn fill(&mut self, dst: &Arc<Buffer>, offset: u64, size: u64, value: u32) -> Result<()> {
        self.dirty = true;
        self.check_open()?;
        if !offset.is_multiple_of(4) || !size.is_multiple_of(4) || offset + size > dst.size() {
            return Err(ModelError::Internal("fill outside a buffer".into()));
        }
        self.track(&[], &[dst.raw()], vk::PipelineStageFlags::TRANSFER);
        self.keep(dst);
        // SAFETY: recording state; range checked.
        unsafe {
            self.ctx
                .device()
                .cmd_fill_buffer(self.cmd, dst.raw(), offset, size, value)
        };
        Ok(())
    }

    fn stamp(&mut self, kernel: Kernel) {
        if self.profile {
            if self.labels.is_empty() {
                // A start mark so the first dispatch gets a duration too.
                self.timestamp("start");
            }
            self.timestamp(kernel.name());
        }
    }

    /// GPU time per label in nanoseconds (the time since the previous stamp),
    /// summed over labels, largest first.
    ///
    /// # Errors
    /// A failing Vulkan call.
    pub fn profile(&self) -> Result<Vec<(String, f64)>> {
        let stamps = self.timestamps()?;
        let mut sums: Vec<(String, f64)> = Vec::new();
        for w in stamps.windows(2) {
            let dt = w[1].1 - w[0].1;
            match sums.iter_mut().find(|(l, _)| *l == w[1].0) {
                Some(e) => e.1 += dt,
                None => sums.push((w[1].0.clone(), dt)),
            }
        }
        for &(label, ns) in &self.host_times {
            let label = format!("{label} (host)");
            match sums.iter_mut().find(|(l, _)| *l == label) {
                Some(e) => e.1 += ns,
                None => sums.push((label, ns)),
            }
        }
        sums.sort_by(|a, b| b.1.total_cmp(&a.1));
        Ok(sums)
    }

    /// Writes a GPU timestamp labelled `label` (no-op without a query pool).
    pub fn timestamp(&mut self, label: &str) {
        let Some(q) = self.query_pool else { return };
        if self.finished || self.labels.len() as u32 >= MAX_TIMESTAMPS {
            return;
        }
        self.dirty = true;
        // SAFETY: recording state; query index within the pool.
        unsafe {
            self.ctx.device().cmd_write_timestamp(
                self.cmd,
                vk::PipelineStageFlags::BOTTOM_OF_PIPE,
                q,
                self.labels.len() as u32,
            )
        };
        self.labels.push(label.to_string());
    }

    /// Ends recording; makes GPU writes visible to the host after completion.
    ///
    /// # Errors
    /// A failing Vulkan call.
    pub fn finish(&mut self) -> Result<()> {
        self.check_open()?;
        if self.streamed > 0 {
            // The last command buffer carries the barrier that makes the
            // GPU's writes visible to the host, even with no dispatch left
            // after the last streamed piece.
            self.dirty = true;
        }
        self.end_commands()?;
        self.finished = true;
        Ok(())
    }

    /// Submits the finished command buffer and waits for it to complete.
    ///
    /// # Errors
    /// Not finished yet, device lost, or a failing Vulkan call.
    pub fn submit_and_wait(&mut self) -> Result<()> {
        self.submit_and_wait_with(wait_mode())
    }

    /// [`Recording::submit_and_wait`] with an explicit way of waiting.
    ///
    /// # Errors
    /// As [`Recording::submit_and_wait`], and whatever a host step returns.
    pub fn submit_and_wait_with(&mut self, mode: WaitMode) -> Result<()> {
        if !self.finished {
            return Err(ModelError::Internal(
                "submitting an unfinished recording".into(),
            ));
        }
        self.host_times.clear();
        let _t = super::phases::time(super::phases::Phase::Execute);
        self.in_doubt = true;
        // Pieces a streaming recording submitted while recording run
        // already; a replay submits them again.
        let mut i = std::mem::take(&mut self.streamed);
        while i < self.steps.len() {
            match &self.steps[i] {
                Step::Commands(_) => {
                    // A run of command buffers (pieces of a streamed
                    // recording) goes out at once; the fence of its last
                    // covers the earlier ones.
                    let n = self.steps[i..]
                        .iter()
                        .take_while(|s| matches!(s, Step::Commands(_)))
                        .count();
                    for (k, s) in self.steps[i..i + n].iter().enumerate() {
                        if let Step::Commands(cmd) = s {
                            let fence = if k + 1 == n {
                                self.fence
                            } else {
                                vk::Fence::null()
                            };
                            self.unwaited = true;
                            // SAFETY: cmd is executable (ended), the fence
                            // unsignaled, and everything the recording
                            // uses is kept alive by it.
                            unsafe { self.ctx.submit(*cmd, fence) }?;
                        }
                    }
                    wait_and_reset(&self.ctx, self.fence, mode)?;
                    self.unwaited = false;
                    i += n;
                }
                Step::Host(_) => {
                    self.wait_unwaited(mode)?;
                    self.ctx.before_host_submission()?;
                    let n = self.steps[i..]
                        .iter()
                        .take_while(|s| matches!(s, Step::Host(_)))
                        .count();
                    let (steps, times) = (&self.steps[i..i + n], &mut self.host_times);
                    run_host_steps(steps, self.profile, times)?;
                    i += n;
                }
            }
        }
        // Streamed pieces with nothing recorded after them.
        self.wait_unwaited(mode)?;
        self.in_doubt = false;
        Ok(())
    }

    /// Labels and GPU times in nanoseconds, measured from the first timestamp,
    /// of the last completed submission.
    ///
    /// # Errors
    /// A failing Vulkan call.
    pub fn timestamps(&self) -> Result<Vec<(String, f64)>> {
        // A waiting query on a lost device is one more place a driver could block.
        self.ctx.check_alive()?;
        let (Some(q), Some(period)) = (self.query_pool, self.ctx.caps().timestamp_period_ns) else {
            return Ok(Vec::new());
        };
        let n = self.labels.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let mut raw = vec![0u64; n];
        // SAFETY: queries 0..n were written by the completed submission.
        unsafe {
            self.ctx.device().get_query_pool_results(
                q,
                0,
                &mut raw,
                vk::QueryResultFlags::TYPE_64 | vk::QueryResultFlags::WAIT,
            )
        }
        .map_err(|r| self.ctx.vk_error("vkGetQueryPoolResults", r))?;
        let t0 = raw[0];
        Ok(self
            .labels
            .iter()
            .zip(raw)
            .map(|(l, t)| (l.clone(), (t.wrapping_sub(t0)) as f64 * f64::from(period)))
            .collect())
    }

    /// Frees this recording's command buffers and descriptor sets so that
    /// `kit` can serve another recording; false where a reset failed.
    ///
    /// # Safety
    /// Nothing of this recording is pending.
    unsafe fn reset_for_reuse(&self, kit: &RecordingKit) -> bool {
        if kit.fence == vk::Fence::null() {
            return false;
        }
        let dev = self.ctx.device();
        let mut cmds: Vec<vk::CommandBuffer> = self
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::Commands(c) => Some(*c),
                Step::Host(_) => None,
            })
            .collect();
        if self.cmd != vk::CommandBuffer::null() && !cmds.contains(&self.cmd) {
            cmds.push(self.cmd);
        }
        // SAFETY: per this function's contract; the buffers are of this pool.
        unsafe {
            if !cmds.is_empty() {
                dev.free_command_buffers(kit.pool, &cmds);
            }
            if dev
                .reset_command_pool(kit.pool, vk::CommandPoolResetFlags::empty())
                .is_err()
            {
                return false;
            }
            for &p in &kit.descriptor_pools {
                if dev
                    .reset_descriptor_pool(p, vk::DescriptorPoolResetFlags::empty())
                    .is_err()
                {
                    return false;
                }
            }
            // A fence left signaled (a recording dropped between its wait and
            // the reset) is reset here; one that is not needs nothing.
            dev.get_fence_status(kit.fence)
                .map(|signaled| !signaled || dev.reset_fences(&[kit.fence]).is_ok())
                .unwrap_or(false)
        }
    }

    /// Dispatches recorded so far.
    pub fn n_dispatches(&self) -> usize {
        self.n_dispatches
    }

    /// Barriers recorded so far.
    pub fn n_barriers(&self) -> usize {
        self.n_barriers
    }

    /// Host steps recorded so far.
    pub fn n_host_steps(&self) -> usize {
        self.n_host_steps
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        if self.unwaited {
            // Streamed pieces of a recording dropped before it was waited
            // for (an error while recording): they may still run. The
            // queue, not a fence, since the submission of one may be what
            // failed.
            let queue = self.ctx.queue();
            // SAFETY: the queue is locked. A lost device returns at once.
            let _ = unsafe { self.ctx.device().queue_wait_idle(*queue) };
        }
        let dev = self.ctx.device();
        let mut pools = std::mem::take(&mut self.descriptor_pools);
        pools.append(&mut self.spare_descriptor_pools);
        let kit = RecordingKit {
            pool: self.pool,
            fence: self.fence,
            descriptor_pools: pools,
        };
        // SAFETY: submit_and_wait always waits (and the above waited for
        // streamed pieces), so no command buffer is pending unless a
        // submission failed part way (in doubt); every handle below was
        // created by this recording or handed to it unused.
        unsafe {
            if let Some(q) = self.query_pool.take() {
                dev.destroy_query_pool(q, None);
            }
            if self.in_doubt || self.ctx.is_lost() || !self.reset_for_reuse(&kit) {
                spare::destroy(dev, kit);
            } else {
                self.ctx.spare_kits.give(dev, kit);
            }
        }
    }
}

/// A barrier's source scope for commands of `stages` (compute when none):
/// the stages and the writes they make.
fn source_scope(stages: vk::PipelineStageFlags) -> (vk::PipelineStageFlags, vk::AccessFlags) {
    let src = if stages.is_empty() {
        vk::PipelineStageFlags::COMPUTE_SHADER
    } else {
        stages
    };
    let mut access = vk::AccessFlags::empty();
    if src.contains(vk::PipelineStageFlags::COMPUTE_SHADER) {
        access |= vk::AccessFlags::SHADER_WRITE;
    }
    if src.contains(vk::PipelineStageFlags::TRANSFER) {
        access |= vk::AccessFlags::TRANSFER_WRITE;
    }
    (src, access)
}

/// Records a global memory barrier: the accesses `src.1` of stages `src.0`
/// become visible to the accesses `dst.1` of stages `dst.0` after it.
///
/// # Safety
/// `cmd` is a command buffer of `dev` in the recording state.
pub(crate) unsafe fn memory_barrier(
    dev: &ash::Device,
    cmd: vk::CommandBuffer,
    src: (vk::PipelineStageFlags, vk::AccessFlags),
    dst: (vk::PipelineStageFlags, vk::AccessFlags),
) {
    let mb = [vk::MemoryBarrier::default()
        .src_access_mask(src.1)
        .dst_access_mask(dst.1)];
    // SAFETY: per this function's contract.
    unsafe {
        dev.cmd_pipeline_barrier(
            cmd,
            src.0,
            dst.0,
            vk::DependencyFlags::empty(),
            &mb,
            &[],
            &[],
        )
    };
}

/// Runs consecutive host steps on one of rayon's workers: the kernels'
/// parallel loops then start on the thread that waits for them, instead of
/// this thread handing each loop to the pool and sleeping until it ends
/// (two context switches per product, hundreds per token).
fn run_host_steps(
    steps: &[Step],
    profile: bool,
    times: &mut Vec<(&'static str, f64)>,
) -> Result<()> {
    rayon::scope(|_| {
        for step in steps {
            if let Step::Host(h) = step {
                let t0 = profile.then(std::time::Instant::now);
                (h.run)(&HostMem::default())?;
                if let Some(t0) = t0 {
                    times.push((h.label, t0.elapsed().as_secs_f64() * 1e9));
                }
            }
        }
        Ok(())
    })
}

/// Records, submits and waits for a one-off piece of GPU work.
///
/// # Errors
/// Whatever `f` or the submission returns.
pub fn run_once(ctx: &Arc<GpuContext>, f: impl FnOnce(&mut Recording) -> Result<()>) -> Result<()> {
    let mut rec = Recording::new(ctx, false)?;
    f(&mut rec)?;
    rec.finish()?;
    rec.submit_and_wait()
}
