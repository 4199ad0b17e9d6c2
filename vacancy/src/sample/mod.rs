//! Capacity samplers implementing [`Resource`](crate::Resource).
