//! An Event a pass decided to publish on its cluster (data only;
//! [`super::write::publish_notes`] publishes them).

use kube::runtime::events::EventType;

/// One Event on the cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct Note {
    pub kind: EventType,
    pub reason: String,
    /// The Event's action: `Reconcile`, or what keeps two series of one reason apart (an
    /// instance down for one reason, then for another).
    pub action: String,
    pub message: String,
    /// The instance the Event is about besides the cluster (its Pod, the related object):
    /// Events of the same reason about different instances stay apart.
    pub instance: Option<String>,
}

impl Note {
    pub fn new(kind: EventType, reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            kind,
            reason: reason.into(),
            action: "Reconcile".to_string(),
            message: message.into(),
            instance: None,
        }
    }

    pub fn action(mut self, action: impl Into<String>) -> Self {
        self.action = action.into();
        self
    }

    pub fn about(mut self, instance: Option<String>) -> Self {
        self.instance = instance;
        self
    }
}
