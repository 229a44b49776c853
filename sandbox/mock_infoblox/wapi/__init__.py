"""The WAPI 2.12 schema data the mock serves, and the script that extracts it."""
