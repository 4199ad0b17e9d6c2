//! Tests of the whole configuration pipeline.
