"""LogitSpec: next-next-token speculation from the last logit, with n-gram retrieval (`conf/method/logitspec.yaml`)."""
