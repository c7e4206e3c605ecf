"""The shopping domain (WebShop, Yao et al. 2022): the shop's products and goals, its
search, its reward, and the converter from WebShop's released files."""
