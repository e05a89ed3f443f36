pub mod backward;
pub mod forward;
