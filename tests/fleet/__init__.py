"""A fleet of hosts on one machine: network namespaces, cgroups, a delay proxy."""
