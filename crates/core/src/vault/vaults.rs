//! Each tenant its own vault.
//!
//! The default tenant's vault is the configured folder, as it always was.
//! Another tenant's is `{folder}/.tenants/{tenant}/`, with its own notes,
//! index, search, context pack and checkpoints: a tenant cannot read,
//! find, plant or restore another's notes. The folder is hidden on
//! purpose: the default tenant's vault skips hidden entries (its walk and
//! its paths both refuse them), so the other tenants' notes are not among
//! its own (under `{folder}/{tenant}/` they would be).
//!
//! With `HARNESS_VAULT_SHARED=true` every tenant uses the one folder, as
//! before vaults were per tenant: the operator's (`default`) tenant
//! writes to it, the others only read it unless
//! `HARNESS_VAULT_SHARED_WRITABLE=true`.

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex, PoisonError},
};

use super::Vault;
use crate::ids::{DEFAULT_TENANT, SessionKey};

/// Tenants' vaults kept built at once; past it, one is built per use.
const KEPT: usize = 1_000;

/// How the tenants share the folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharing {
    /// Each tenant its own vault (the default).
    PerTenant,
    /// One vault for all; the other tenants write only when `writable`.
    Shared { writable: bool },
}

/// The vaults of the tenants.
pub struct Vaults {
    /// The default tenant's.
    default: Arc<Vault>,
    sharing: Sharing,
    /// The other tenants', as built (a shared vault's read-only twin too).
    built: Mutex<HashMap<String, Arc<Vault>>>,
}

impl Vaults {
    pub fn new(default: Vault, sharing: Sharing) -> Self {
        Self {
            default: Arc::new(default),
            sharing,
            built: Mutex::new(HashMap::new()),
        }
    }

    /// One vault for every tenant, writable by all (a test's, a tool's
    /// built on one folder).
    pub fn one(vault: Arc<Vault>) -> Self {
        Self {
            default: vault,
            sharing: Sharing::Shared { writable: true },
            built: Mutex::new(HashMap::new()),
        }
    }

    /// The default tenant's vault.
    pub fn default_vault(&self) -> &Arc<Vault> {
        &self.default
    }

    /// How the tenants share the folder.
    pub fn sharing(&self) -> Sharing {
        self.sharing
    }

    /// Where the other tenants' vaults are: `{folder}/.tenants`.
    pub fn tenants_root(&self) -> PathBuf {
        self.default.root().join(".tenants")
    }

    /// The folder of `tenant`'s vault: its name, unless it begins with a
    /// dot (`..` would be the folder above): then `%` and the name (`%`
    /// is in no tenant's name).
    fn folder_of(&self, tenant: &str) -> PathBuf {
        let name = if tenant.starts_with('.') {
            format!("%{tenant}")
        } else {
            tenant.to_owned()
        };
        self.tenants_root().join(name)
    }

    /// Forgets `tenant`'s own vault: the folder its notes were in, to be
    /// removed (`None`: it has none of its own; the default tenant's and
    /// the shared vault are the operator's folder).
    pub fn forget_tenant(&self, tenant: &str) -> Option<PathBuf> {
        if tenant == DEFAULT_TENANT || self.sharing != Sharing::PerTenant {
            return None;
        }
        self.built
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(tenant);
        Some(self.folder_of(tenant))
    }

    /// The vault of `tenant`.
    pub fn of_tenant(&self, tenant: &str) -> Arc<Vault> {
        if tenant == DEFAULT_TENANT || self.sharing == (Sharing::Shared { writable: true }) {
            return self.default.clone();
        }
        let mut built = self.built.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(vault) = built.get(tenant) {
            return vault.clone();
        }
        let vault = Arc::new(match self.sharing {
            Sharing::Shared { .. } => {
                self.default
                    .sibling("", self.default.root().to_path_buf(), true)
            }
            Sharing::PerTenant => self.default.sibling(tenant, self.folder_of(tenant), false),
        });
        // Bounded: past so many tenants, a vault is built per use (its
        // cached embeddings are read again).
        if built.len() < KEPT {
            built.insert(tenant.to_owned(), vault.clone());
        }
        vault
    }

    /// The vault of the tenant of a session (as stored).
    pub fn of_session(&self, session_id: &str) -> Arc<Vault> {
        self.of_tenant(SessionKey::from_stored(session_id).tenant())
    }

    /// The tenants that have a vault folder now, by name (read at start,
    /// to index them); at most `most`.
    pub fn tenants_with_folders(&self, most: usize) -> Vec<String> {
        if self.sharing != Sharing::PerTenant {
            return Vec::new();
        }
        let Ok(entries) = std::fs::read_dir(self.tenants_root()) else {
            return Vec::new();
        };
        entries
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().into_string().ok())
            .map(|name| match name.strip_prefix('%') {
                Some(dotted) => dotted.to_owned(),
                None => name,
            })
            .take(most)
            .collect()
    }
}
