"""The other designs the service is measured against, each as small as its kind allows."""
