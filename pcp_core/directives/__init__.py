"""Worker directives (§7.3): what the worker may ask for, how its reply is read, and what a directive does to the views."""
