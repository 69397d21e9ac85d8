"""Latency profiles: the committed profiles/*.json, the roofline generator, the fit of its
efficiency factors, and the profiling harness (torch, imported only when it runs)."""

from kvsim.profiles.lookup import (
    PROFILE_DIR,
    check_profile_matches,
    default_profile,
    draft_profile,
    find_profile_path,
    load_named_profile,
    profile_filename,
)

__all__ = ["PROFILE_DIR", "check_profile_matches", "default_profile", "draft_profile",
           "find_profile_path", "load_named_profile",
           "profile_filename"]
