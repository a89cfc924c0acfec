//! Scenarios against real PostgreSQL servers on loopback ports (no Kubernetes): each test
//! names what a user would notice, and leaves no server or directory behind.

mod bootstrap;
mod common;
mod config;
mod durability;
mod failover;
mod metrics;
mod rejoin;
mod replication;
