//! `VK_NV_cooperative_matrix2`: workgroup-scope cooperative matrices with
//! tensor-addressed loads and decode callbacks (`glsl/matmul_cm2.comp`).
//! ash 0.38 predates the extension, so its two structures and its one
//! query are declared here, from the Vulkan registry.

use std::ffi::{CStr, c_void};

use ash::vk;

/// The extension's name.
pub const NAME: &CStr = c"VK_NV_cooperative_matrix2";

const FEATURES_TYPE: vk::StructureType = vk::StructureType::from_raw(1_000_593_000);
const FLEX_TYPE: vk::StructureType = vk::StructureType::from_raw(1_000_593_001);
const PROPERTIES_TYPE: vk::StructureType = vk::StructureType::from_raw(1_000_593_002);

/// `VkPhysicalDeviceCooperativeMatrix2FeaturesNV`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Features {
    s_type: vk::StructureType,
    p_next: *mut c_void,
    /// Matrices of workgroup scope.
    pub workgroup_scope: vk::Bool32,
    /// Dimensions other than the subgroup-scope shapes.
    pub flexible_dimensions: vk::Bool32,
    /// Row and column reductions.
    pub reductions: vk::Bool32,
    /// Conversions between uses and element types.
    pub conversions: vk::Bool32,
    /// `coopMatPerElementNV`.
    pub per_element_operations: vk::Bool32,
    /// Tensor layouts and views for loads and stores.
    pub tensor_addressing: vk::Bool32,
    /// Block-quantized loads with decode callbacks.
    pub block_loads: vk::Bool32,
}

impl Default for Features {
    fn default() -> Self {
        Features {
            s_type: FEATURES_TYPE,
            p_next: std::ptr::null_mut(),
            workgroup_scope: vk::FALSE,
            flexible_dimensions: vk::FALSE,
            reductions: vk::FALSE,
            conversions: vk::FALSE,
            per_element_operations: vk::FALSE,
            tensor_addressing: vk::FALSE,
            block_loads: vk::FALSE,
        }
    }
}

impl Features {
    /// What `matmul_cm2.comp` uses, to enable at device creation.
    pub fn required() -> Self {
        Features {
            workgroup_scope: vk::TRUE,
            flexible_dimensions: vk::TRUE,
            per_element_operations: vk::TRUE,
            tensor_addressing: vk::TRUE,
            block_loads: vk::TRUE,
            ..Default::default()
        }
    }

    /// Whether `matmul_cm2.comp` can run: it uses workgroup scope, flexible
    /// dimensions, per-element callbacks, tensor addressing and decode
    /// callbacks.
    pub fn enough(&self) -> bool {
        [
            self.workgroup_scope,
            self.flexible_dimensions,
            self.per_element_operations,
            self.tensor_addressing,
            self.block_loads,
        ]
        .iter()
        .all(|&b| b == vk::TRUE)
    }

    /// Links `next` behind this structure (for `vkCreateDevice`'s chain).
    ///
    /// # Safety
    /// `next` must outlive every use of the chain.
    pub unsafe fn chain(&mut self, next: *mut c_void) -> *mut c_void {
        self.p_next = next;
        (self as *mut Self).cast()
    }
}

/// `VkPhysicalDeviceCooperativeMatrix2PropertiesNV`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct Properties {
    s_type: vk::StructureType,
    p_next: *mut c_void,
    workgroup_scope_max_workgroup_size: u32,
    flexible_dimensions_max_dimension: u32,
    workgroup_scope_reserved_shared_memory: u32,
}

/// `VkCooperativeMatrixFlexibleDimensionsPropertiesNV`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct FlexProperties {
    s_type: vk::StructureType,
    p_next: *mut c_void,
    m_granularity: u32,
    n_granularity: u32,
    k_granularity: u32,
    a_type: vk::ComponentTypeKHR,
    b_type: vk::ComponentTypeKHR,
    c_type: vk::ComponentTypeKHR,
    result_type: vk::ComponentTypeKHR,
    saturating_accumulation: vk::Bool32,
    scope: vk::ScopeKHR,
    workgroup_invocations: u32,
}

type GetFlexProperties =
    unsafe extern "system" fn(vk::PhysicalDevice, *mut u32, *mut FlexProperties) -> vk::Result;

/// One workgroup-scope f16 × f16 → f32 shape class the driver accepts:
/// M, N and K must be multiples of the granularities, with this many
/// invocations per workgroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlexShape {
    /// Granularity of M (rows of A and the result).
    pub m: u32,
    /// Granularity of N (columns of B and the result).
    pub n: u32,
    /// Granularity of K.
    pub k: u32,
    /// Invocations per workgroup.
    pub invocations: u32,
}

/// What the device offers of the extension, when it offers enough of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoopMat2 {
    /// Largest workgroup that may use workgroup-scope matrices.
    pub max_workgroup_size: u32,
    /// Shared memory the driver keeps for them, bytes.
    pub reserved_shared_memory: u32,
    /// Workgroup-scope f16 × f16 → f32 shapes.
    pub shapes: Vec<FlexShape>,
}

impl CoopMat2 {
    /// Whether a BM × BN × BK tile (BM rows as two accumulators of BM / 2)
    /// with `invocations` per workgroup matches a shape the driver lists.
    pub fn accepts(&self, bm: u32, bn: u32, bk: u32, invocations: u32) -> bool {
        invocations <= self.max_workgroup_size
            && self.shapes.iter().any(|s| {
                s.invocations == invocations
                    && (bm / 2).is_multiple_of(s.m)
                    && bn.is_multiple_of(s.n)
                    && bk.is_multiple_of(s.k)
            })
    }
}

/// Reads the extension's features and shapes; `None` where the device
/// lacks the extension or a feature `matmul_cm2.comp` needs.
pub(crate) fn query(
    entry: &ash::Entry,
    instance: &ash::Instance,
    pd: vk::PhysicalDevice,
) -> Option<CoopMat2> {
    let mut features = Features::default();
    let mut f2 = vk::PhysicalDeviceFeatures2 {
        p_next: (&mut features as *mut Features).cast(),
        ..Default::default()
    };
    // SAFETY: the caller checked that pd has the extension; the chain lives on this frame.
    unsafe { instance.get_physical_device_features2(pd, &mut f2) };
    if !features.enough() {
        return None;
    }
    let mut props = Properties {
        s_type: PROPERTIES_TYPE,
        p_next: std::ptr::null_mut(),
        workgroup_scope_max_workgroup_size: 0,
        flexible_dimensions_max_dimension: 0,
        workgroup_scope_reserved_shared_memory: 0,
    };
    let mut p2 = vk::PhysicalDeviceProperties2 {
        p_next: (&mut props as *mut Properties).cast(),
        ..Default::default()
    };
    // SAFETY: as above.
    unsafe { instance.get_physical_device_properties2(pd, &mut p2) };

    // SAFETY: a valid instance and a NUL-terminated name.
    let f = unsafe {
        (entry.static_fn().get_instance_proc_addr)(
            instance.handle(),
            c"vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV".as_ptr(),
        )
    }?;
    // SAFETY: the loader returned the entry point of this name, whose
    // signature the registry gives as GetFlexProperties.
    let f: GetFlexProperties = unsafe { std::mem::transmute(f) };
    let mut count = 0u32;
    // SAFETY: a count query with a null array.
    if unsafe { f(pd, &mut count, std::ptr::null_mut()) } != vk::Result::SUCCESS {
        return None;
    }
    let blank = FlexProperties {
        s_type: FLEX_TYPE,
        p_next: std::ptr::null_mut(),
        m_granularity: 0,
        n_granularity: 0,
        k_granularity: 0,
        a_type: vk::ComponentTypeKHR::FLOAT16,
        b_type: vk::ComponentTypeKHR::FLOAT16,
        c_type: vk::ComponentTypeKHR::FLOAT16,
        result_type: vk::ComponentTypeKHR::FLOAT16,
        saturating_accumulation: vk::FALSE,
        scope: vk::ScopeKHR::WORKGROUP,
        workgroup_invocations: 0,
    };
    let mut list = vec![blank; count as usize];
    // SAFETY: list holds count initialized structures.
    let r = unsafe { f(pd, &mut count, list.as_mut_ptr()) };
    if r != vk::Result::SUCCESS && r != vk::Result::INCOMPLETE {
        return None;
    }
    list.truncate(count as usize);
    let shapes: Vec<FlexShape> = list
        .iter()
        .filter(|p| {
            p.a_type == vk::ComponentTypeKHR::FLOAT16
                && p.b_type == vk::ComponentTypeKHR::FLOAT16
                && p.c_type == vk::ComponentTypeKHR::FLOAT32
                && p.result_type == vk::ComponentTypeKHR::FLOAT32
                && p.scope == vk::ScopeKHR::WORKGROUP
                && p.m_granularity > 0
                && p.n_granularity > 0
                && p.k_granularity > 0
        })
        .map(|p| FlexShape {
            m: p.m_granularity,
            n: p.n_granularity,
            k: p.k_granularity,
            invocations: p.workgroup_invocations,
        })
        .collect();
    (!shapes.is_empty()).then_some(CoopMat2 {
        max_workgroup_size: props.workgroup_scope_max_workgroup_size,
        reserved_shared_memory: props.workgroup_scope_reserved_shared_memory,
        shapes,
    })
}
