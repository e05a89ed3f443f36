//! What host and device share, exactly once: the call's shape, the sequence layout, the launch
//! parameters, the dropout RNG and the storage dtypes.

pub mod grid;
pub mod layout;
pub mod params;
pub mod philox;
pub mod shape;
pub mod storage;
