"""A Ray job followed through the head's job API: the client's calls, its statuses, its
log as it grows, and the watch of its status until it ends or its head is gone. Below
both `uerl submit` and `uerl supervise`, which read a job the same way."""
