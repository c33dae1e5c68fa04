"""The versioned artifact registry of normbridge (built in a later issue; nothing here yet)."""
