//! Plugin loading: the plugins directory (safe reads, hot reload), each plugin's operator settings
//! (`NAME.toml`), and the offline commands that read a component without a cluster (`inspect`,
//! `replay`).

pub mod files;
pub mod inspect;
pub mod objects;
pub mod plugins;
pub mod rbac;
pub mod replay;
pub mod settings;
