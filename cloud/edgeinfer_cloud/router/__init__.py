"""The cloud-side hybrid router: serves requests the edge offloads."""
