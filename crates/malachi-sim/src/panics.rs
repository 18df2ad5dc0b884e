//! Panics anywhere in a run are findings: a panic hook records them, since a panicking task
//! on a tokio runtime otherwise ends quietly.

use std::sync::{Mutex, Once};

static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());
static HOOK: Once = Once::new();

/// Installs the hook (once per process) and forgets earlier panics.
pub fn reset() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let location = info.location().map(|at| format!(" at {at}")).unwrap_or_default();
            let message = info
                .payload()
                .downcast_ref::<&str>()
                .map(|text| text.to_string())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_default();
            PANICS
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .push(format!("{message}{location}"));
            previous(info);
        }));
    });
    PANICS.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clear();
}

pub fn take() -> Vec<String> {
    std::mem::take(&mut *PANICS.lock().unwrap_or_else(|poisoned| poisoned.into_inner()))
}
